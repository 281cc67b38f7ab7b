-- 0001 initial: the outbox, lane and member leases, parked keys and the store's metadata.
-- Placeholders in braces are identifiers composed with psycopg.sql.Identifier.

CREATE TABLE {outbox} (
    id uuid NOT NULL,
    -- Lane -1 and no ordering_key: an unordered row (sent after commit, recovered by maintenance)
    lane integer NOT NULL CHECK (lane >= -1),
    ordering_key text,
    -- NULL transport: the store's default transport, resolved by the worker at send time
    transport text,
    destination text NOT NULL,
    body bytea NOT NULL,
    headers jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    deliver_at timestamptz,
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((lane = -1) = (ordering_key IS NULL)),
    -- The only index: each lane's rows head first (lane -1: unordered rows, oldest first). One
    -- index to maintain per row keeps writes and deletes cheap; every lookup knows the lane.
    PRIMARY KEY (lane, id)
);

-- 'member:<instance id>' rows (membership) and 'lane:<n>' rows (lane leases).
CREATE TABLE {leases} (
    name text PRIMARY KEY,
    lane integer CHECK (lane >= 0),
    owner text NOT NULL,
    token uuid NOT NULL,
    expires_at timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    renewed_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((lane IS NULL) = (name LIKE 'member:%'))
);
CREATE UNIQUE INDEX {leases_lane} ON {leases} (lane) WHERE lane IS NOT NULL;

-- Ordering keys whose head row failed. Their later rows wait; other keys keep flowing.
-- retry_at NULL: max_attempts reached, the key waits for an operator (redrive or drop).
CREATE TABLE {parked} (
    ordering_key text PRIMARY KEY,
    lane integer NOT NULL CHECK (lane >= 0),
    head_id uuid NOT NULL,
    attempts integer NOT NULL,
    last_error text NOT NULL,
    retry_at timestamptz,
    parked_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {parked_lane} ON {parked} (lane, ordering_key);

-- One row: the lane count every writer and worker must use, and the schema version.
CREATE TABLE {meta} (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    lanes integer NOT NULL CHECK (lanes BETWEEN 1 AND 65536),
    schema_version integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
