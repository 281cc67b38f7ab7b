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

-- name: _store_health
-- A fragment: a store's health in one statement (relayer.health): each table's live and dead
-- tuples, last vacuum and size (one array per column, tables in name order); the age in seconds
-- of the oldest due row (by id, through the primary key; 0 if none); the unordered rows that
-- failed at least once (how many, the most attempts, the latest error). It reads the outbox
-- only, so an operator's role with the grants of docs/security.md can run it.
-- The statistics are read with the functions behind pg_stat_user_tables, for these tables only:
-- that view groups every relation of the database before a join can pick a few (with hundreds
-- of stores in one database, most of the statement's time).
WITH tables AS MATERIALIZED (
    SELECT c.relname::text AS name,
           pg_catalog.pg_stat_get_live_tuples(c.oid) AS live,
           pg_catalog.pg_stat_get_dead_tuples(c.oid) AS dead,
           greatest(pg_catalog.pg_stat_get_last_autovacuum_time(c.oid),
                    pg_catalog.pg_stat_get_last_vacuum_time(c.oid)) AS vacuumed,
           pg_catalog.pg_total_relation_size(c.oid) AS size
    FROM pg_catalog.pg_class AS c
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relname = ANY(%(tables)s) AND c.relkind IN ('r', 'p')
), failing AS MATERIALIZED (
    SELECT pg_catalog.count(*) AS rows, coalesce(pg_catalog.max(attempts), 0) AS attempts
    FROM {outbox}
    WHERE lane = -1 AND attempts > 0
)
SELECT ARRAY(SELECT name FROM tables ORDER BY name),
       ARRAY(SELECT live FROM tables ORDER BY name),
       ARRAY(SELECT dead FROM tables ORDER BY name),
       ARRAY(SELECT vacuumed FROM tables ORDER BY name),
       ARRAY(SELECT size FROM tables ORDER BY name),
       coalesce((
           SELECT greatest(extract(epoch FROM pg_catalog.now() - greatest(created_at, deliver_at)), 0)::float8
           FROM {outbox}
           WHERE deliver_at IS NULL OR deliver_at <= pg_catalog.now()
           ORDER BY id
           LIMIT 1
       ), 0)::float8,
       (SELECT rows FROM failing),
       (SELECT attempts FROM failing),
       (SELECT last_error FROM {outbox} WHERE lane = -1 AND attempts > 0 ORDER BY id DESC LIMIT 1)

-- name: store_health
-- The health alone (relayer status, the dashboard).
{_store_health}

-- name: store_health_and_retention
-- The health, and whether a retention has rows to delete (a NULL retention has none), so that
-- a cleanup with nothing to delete starts no transaction (the cleanup leader's look: it reads
-- the inbox, sequence and parked tables, which an operator's role may not).
{_store_health},
       EXISTS (
           SELECT 1 FROM {inbox}
           WHERE received_at < pg_catalog.now() - %(inbox_retention)s::interval
       ) OR EXISTS (
           SELECT 1 FROM {inbox_keys}
           WHERE updated_at < pg_catalog.now() - %(inbox_retention)s::interval
       ) OR EXISTS (
           SELECT 1 FROM {sequences} AS s
           WHERE s.updated_at < pg_catalog.now() - %(sequence_retention)s::interval
             AND NOT EXISTS (SELECT 1 FROM {outbox} AS o WHERE o.ordering_key = s.ordering_key)
       ) OR EXISTS (
           SELECT 1 FROM {parked}
           WHERE retry_at IS NULL AND updated_at < pg_catalog.now() - %(parked_retention)s::interval
       )
