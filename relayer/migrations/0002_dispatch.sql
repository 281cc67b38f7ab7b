-- 0002 dispatch: cluster-wide queue controls (pause, concurrency limit) and their audit trail.
-- Placeholders in braces are identifiers composed with psycopg.sql.Identifier.
-- Slots in use are not stored: they are session advisory locks of each process's dispatcher
-- connection, so they vanish the moment a holder finishes or its connection dies.

-- The current state of each queue that was ever paused or limited. The row named '*' holds the
-- pause of every queue of the store ("pause --all"); a queue is paused if its row or '*' is.
CREATE TABLE {queues} (
    queue text PRIMARY KEY CHECK (length(queue) BETWEEN 1 AND 200),
    paused boolean NOT NULL DEFAULT false,
    -- who changed the pause state last, when and why (kept after a resume, for the status)
    changed_by text,
    changed_at timestamptz,
    reason text,
    -- NULL: no limit. Counted at claim time across every process of the cluster.
    concurrency_limit integer CHECK (concurrency_limit >= 1),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Every pause, resume and limit change, for operators and auditors.
CREATE TABLE {queue_events} (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    action text NOT NULL CHECK (action IN ('pause', 'resume', 'limit')),
    actor text NOT NULL,
    reason text,
    -- for 'limit': the new limit (NULL: removed)
    concurrency_limit integer,
    occurred_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX {queue_events_queue} ON {queue_events} (queue, id);
