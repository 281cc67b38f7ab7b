-- Maintenance jobs of the workers: retention of parked keys, task locks and the health check.

-- name: maintenance_try_lock
-- One worker of the cluster runs a cleanup pass at a time; the others skip it.
SELECT pg_catalog.pg_try_advisory_xact_lock(%(key)s)

-- name: parked_expired
-- Keys that have waited for an operator (retry_at NULL) longer than parked_retention.
SELECT ordering_key, lane FROM {parked}
WHERE retry_at IS NULL AND updated_at < pg_catalog.now() - %(retention)s
ORDER BY updated_at
LIMIT %(limit)s

-- name: drop_expired_parked_key
-- Like `relayer parked drop`, after the caller locked the key's lane: only if the key still
-- waits for an operator and has waited long enough (an operator may have redriven it since).
WITH unparked AS (
    DELETE FROM {parked}
    WHERE ordering_key = %(key)s AND retry_at IS NULL AND updated_at < pg_catalog.now() - %(retention)s
    RETURNING lane, head_id, attempts, last_error, updated_at
), dropped AS (
    DELETE FROM {outbox} AS o
    USING unparked
    WHERE o.lane = unparked.lane AND o.ordering_key = %(key)s
    RETURNING o.id
)
SELECT (SELECT pg_catalog.count(*) FROM dropped), head_id, attempts, last_error,
       extract(epoch FROM pg_catalog.now() - updated_at)::float8
FROM unparked

-- name: table_health
-- Dead tuples, the last vacuum and the size of each of the store's tables.
SELECT c.relname,
       coalesce(s.n_live_tup, 0),
       coalesce(s.n_dead_tup, 0),
       greatest(s.last_autovacuum, s.last_vacuum),
       pg_catalog.pg_total_relation_size(c.oid)
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_stat_user_tables AS s ON s.relid = c.oid
WHERE n.nspname = %(schema)s AND c.relname = ANY(%(tables)s) AND c.relkind IN ('r', 'p')
ORDER BY c.relname

-- name: oldest_due_age
-- Seconds since the oldest row (by id, through the primary key) became due.
SELECT greatest(extract(epoch FROM pg_catalog.now() - greatest(created_at, deliver_at)), 0)::float8
FROM {outbox}
WHERE deliver_at IS NULL OR deliver_at <= pg_catalog.now()
ORDER BY id
LIMIT 1

-- name: unordered_health
-- Unordered rows that failed at least once: how many, the most attempts, the latest error.
SELECT pg_catalog.count(*),
       coalesce(pg_catalog.max(attempts), 0),
       (SELECT last_error FROM {outbox}
        WHERE lane = -1 AND attempts > 0 ORDER BY id DESC LIMIT 1)
FROM {outbox}
WHERE lane = -1 AND attempts > 0
