-- Named queries of the dispatch layer (same format and namespace as queries.sql; every name
-- starts with queue_). {placeholders} are identifiers composed with psycopg.sql.Identifier.
--
-- A slot of a limited queue is the session advisory lock (queue key, slot number), slot numbers
-- 0 .. limit-1, held by the dispatcher connection of the process running the job. PostgreSQL
-- drops it when the job's release unlocks it or when that connection dies.
--
-- The claim logic is the PL/pgSQL function {claim_slots} of the store's schema (migration 0005):
-- it reads no table (the calling statement passes the pause flags and limits).

-- name: queue_claim
-- Lock keys, positions and slot numbers come as comma-separated text, the queue names as a
-- JSON array of strings (any name survives it): a string binds and parses far cheaper than an
-- array parameter (a claim per batch transaction at a steady rate).
-- Without a concurrency limit on any queue asked for and no slot to release, no advisory lock
-- is taken or released: the grants are the wanted positions of the queues not paused, in order,
-- at most the budget, and the states "paused" or "open", exactly as the claim function would
-- return them, without calling it (a PL/pgSQL call was most of the claim's server time: one
-- claim a batch transaction at a steady rate). Otherwise the function decides.
WITH every_queue AS MATERIALIZED (
    SELECT coalesce(pg_catalog.bool_or(a.paused), false) AS paused FROM {queues} a WHERE a.queue = '*'
), requested AS MATERIALIZED (
    SELECT u.ordinal,
           coalesce(q.paused, false) OR (SELECT paused FROM every_queue) AS paused,
           q.concurrency_limit
    FROM pg_catalog.json_array_elements_text(%(queues)s::json) WITH ORDINALITY AS u(queue, ordinal)
    LEFT JOIN {queues} q ON q.queue = u.queue
), simple AS MATERIALIZED (
    SELECT %(release_keys)s = '' AND NOT EXISTS (
        SELECT FROM requested r WHERE r.concurrency_limit IS NOT NULL
    ) AS yes
)
SELECT claimed.* FROM (
SELECT c.wanted_position, c.queue_position, c.granted_slot, c.queue_state, c.queue_limit
FROM {claim_slots}(
    (SELECT paused FROM every_queue),
    ARRAY(SELECT r.paused FROM requested r ORDER BY r.ordinal),
    ARRAY(SELECT r.concurrency_limit FROM requested r ORDER BY r.ordinal),
    pg_catalog.string_to_array(%(keys)s, ',')::integer[],
    pg_catalog.string_to_array(%(wanted)s, ',')::integer[],
    %(budget)s::integer,
    pg_catalog.string_to_array(%(held_keys)s, ',')::integer[],
    pg_catalog.string_to_array(%(held_slots)s, ',')::integer[],
    pg_catalog.string_to_array(%(release_keys)s, ',')::integer[],
    pg_catalog.string_to_array(%(release_slots)s, ',')::integer[]
) AS c
WHERE NOT (SELECT yes FROM simple)
UNION ALL
(SELECT (w.position - 1)::integer, (w.queue - 1)::integer, NULL::integer, 'granted', NULL::integer
 FROM pg_catalog.unnest(pg_catalog.string_to_array(%(wanted)s, ',')::integer[])
     WITH ORDINALITY AS w(queue, position)
 JOIN requested r ON r.ordinal = w.queue
 WHERE (SELECT yes FROM simple) AND NOT r.paused
 ORDER BY w.position
 LIMIT greatest(%(budget)s::integer, 0))
UNION ALL
(SELECT NULL::integer, (r.ordinal - 1)::integer, NULL::integer,
        CASE WHEN r.paused THEN 'paused' ELSE 'open' END, NULL::integer
 FROM requested r
 WHERE (SELECT yes FROM simple))
) AS claimed
-- The function's own order: the grants in wanted order, then a row per queue.
ORDER BY claimed.wanted_position NULLS LAST, claimed.queue_position

-- name: queue_unlock_slots
SELECT pg_catalog.count(*) FILTER (WHERE pg_catalog.pg_advisory_unlock(lock_key, slot))
FROM ROWS FROM (pg_catalog.unnest(%s::integer[]),
    pg_catalog.unnest(%s::integer[])) AS u(lock_key, slot)

-- name: queue_own_slot_locks
SELECT classid::bigint, objid::bigint
FROM pg_catalog.pg_locks
WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND pid = pg_catalog.pg_backend_pid()
  AND classid::bigint = ANY(%s::bigint[])

-- name: queue_slots_in_use
SELECT classid::bigint, pg_catalog.count(*)
FROM pg_catalog.pg_locks
WHERE locktype = 'advisory' AND objsubid = 2 AND granted
  AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())
  AND classid::bigint = ANY(%s::bigint[])
GROUP BY classid

-- name: queue_set_pause
WITH changed AS (
    INSERT INTO {queues} AS q (queue, paused, changed_by, changed_at, reason)
    VALUES (%(queue)s, %(paused)s, %(actor)s, pg_catalog.now(), %(reason)s)
    ON CONFLICT (queue) DO UPDATE
    SET paused = excluded.paused, changed_by = excluded.changed_by,
        changed_at = excluded.changed_at, reason = excluded.reason, updated_at = pg_catalog.now()
    RETURNING q.queue
)
INSERT INTO {queue_events} (queue, action, actor, reason)
SELECT queue, CASE WHEN %(paused)s THEN 'pause' ELSE 'resume' END, %(actor)s, %(reason)s
FROM changed

-- name: queue_set_limit
WITH changed AS (
    INSERT INTO {queues} AS q (queue, concurrency_limit)
    VALUES (%(queue)s, %(limit)s)
    ON CONFLICT (queue) DO UPDATE
    SET concurrency_limit = excluded.concurrency_limit, updated_at = pg_catalog.now()
    RETURNING q.queue
)
INSERT INTO {queue_events} (queue, action, actor, reason, concurrency_limit)
SELECT queue, 'limit', %(actor)s, %(reason)s, %(limit)s FROM changed

-- name: queue_states
SELECT queue, paused, changed_by, changed_at, reason, concurrency_limit
FROM {queues}
ORDER BY queue = '*' DESC, queue

-- name: queue_event_log
SELECT id, queue, action, actor, reason, concurrency_limit, occurred_at
FROM {queue_events}
WHERE %(queue)s::text IS NULL OR queue = %(queue)s::text
ORDER BY id DESC
LIMIT %(limit)s

-- name: queue_unlock_all
SELECT pg_catalog.pg_advisory_unlock_all()

-- name: queue_begin
-- Behind a transaction pooler the dispatcher connection holds its slots inside an open
-- transaction (relayer.dispatch.postgres): the statements that take or release slots run in
-- it under a savepoint, so that a failed one leaves the transaction usable; so does a store's
-- schema check while other stores' slots are held.
BEGIN

-- name: queue_commit
COMMIT

-- name: queue_claim_savepoint
SAVEPOINT relayer_claim

-- name: queue_claim_savepoint_release
RELEASE SAVEPOINT relayer_claim

-- name: queue_claim_savepoint_rollback
ROLLBACK TO SAVEPOINT relayer_claim

-- name: queue_check_savepoint
SAVEPOINT relayer_check

-- name: queue_check_savepoint_release
RELEASE SAVEPOINT relayer_check

-- name: queue_check_savepoint_rollback
ROLLBACK TO SAVEPOINT relayer_check
