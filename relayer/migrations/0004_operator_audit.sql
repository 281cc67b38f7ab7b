-- 0004 operator audit: every operator change to parked keys (redrive, drop), from the CLI or the
-- dashboard, and an index for paging parked keys in the order they were parked.
-- Placeholders in braces are identifiers composed with psycopg.sql.Identifier.
-- Queue changes keep their own trail ({queue_events}, written in the same statement as the
-- change); the dashboard's audit view shows both.

CREATE TABLE {audit} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    occurred_at timestamptz NOT NULL DEFAULT now(),
    -- where the change came from: 'cli' or 'dashboard'
    source text NOT NULL CHECK (length(source) BETWEEN 1 AND 40),
    actor text NOT NULL CHECK (length(actor) BETWEEN 1 AND 200),
    -- 'redrive', 'drop' (every pending row of the key) or 'drop_head' (the head row only)
    action text NOT NULL CHECK (action IN ('redrive', 'drop', 'drop_head')),
    ordering_key text NOT NULL,
    lane integer,
    -- the head row and attempt count the operator saw (the guard of a dashboard action)
    head_id uuid,
    attempts integer,
    rows_affected integer NOT NULL DEFAULT 0,
    reason text,
    -- 'applied', or why nothing changed: 'stale' (the key changed since it was shown),
    -- 'not_parked' (redriven, dropped or delivered meanwhile)
    outcome text NOT NULL CHECK (outcome IN ('applied', 'stale', 'not_parked'))
);
CREATE INDEX {audit_key} ON {audit} (ordering_key, id);

-- Keyset pages of parked keys in parking order (the dashboard's list, 10,000s of keys).
CREATE INDEX {parked_since} ON {parked} (parked_at, ordering_key);
