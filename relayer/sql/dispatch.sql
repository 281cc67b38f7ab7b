-- Named queries of the dispatch layer (same format and namespace as queries.sql; every name
-- starts with queue_). {placeholders} are identifiers composed with psycopg.sql.Identifier.
--
-- A slot of a limited queue is the session advisory lock (queue key, slot number), slot numbers
-- 0 .. limit-1, held by the dispatcher connection of the process running the job. PostgreSQL
-- drops it when the job's release unlocks it or when that connection dies.
--
-- The claim logic is a PL/pgSQL function each dispatcher connection creates in its own pg_temp
-- schema: it reads no table (the calling statement passes the pause flags and limits), so one
-- definition serves every store, every process runs the logic of its own version, and the
-- migrated schema holds only tables.

-- name: queue_claim_function
CREATE OR REPLACE FUNCTION pg_temp.relayer_claim_slots(
    all_paused boolean,
    is_paused boolean[],
    limits integer[],
    lock_keys integer[],
    wanted integer[],
    budget integer,
    held_keys integer[],
    held_slots integer[],
    release_keys integer[],
    release_slots integer[]
) RETURNS TABLE (
    wanted_position integer,
    queue_position integer,
    granted_slot integer,
    queue_state text,
    queue_limit integer
)
LANGUAGE plpgsql VOLATILE
-- Name lookups in the body ignore the caller's search_path, so no function or operator of a
-- schema placed ahead of pg_catalog can stand in for a built-in one.
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    queue_count integer := coalesce(pg_catalog.array_length(lock_keys, 1), 0);
    next_slot integer[];
    refused boolean[];
    remaining integer := budget;
    candidate integer;
    slot_number integer;
    found_slot boolean;
BEGIN
    -- Finished jobs first: their slots may be granted again in this same call.
    FOR i IN 1 .. coalesce(pg_catalog.array_length(release_keys, 1), 0) LOOP
        PERFORM pg_catalog.pg_advisory_unlock(release_keys[i], release_slots[i]);
    END LOOP;
    FOR i IN 1 .. queue_count LOOP
        is_paused[i] := all_paused OR is_paused[i];
        next_slot[i] := 0;
        refused[i] := is_paused[i];
    END LOOP;
    -- Walk the planner's order. Every lock taken here is returned as a row (RETURN NEXT), so
    -- nothing is acquired and then dropped on the floor.
    FOR j IN 1 .. coalesce(pg_catalog.array_length(wanted, 1), 0) LOOP
        EXIT WHEN remaining <= 0;
        candidate := wanted[j];
        CONTINUE WHEN refused[candidate];
        found_slot := false;
        slot_number := NULL;
        IF limits[candidate] IS NULL THEN
            found_slot := true;
        ELSE
            WHILE next_slot[candidate] < limits[candidate] LOOP
                slot_number := next_slot[candidate];
                next_slot[candidate] := slot_number + 1;
                -- Nested IFs, not AND: SQL does not promise the order of AND, and a session
                -- that locks a slot it already holds would count it twice.
                IF NOT EXISTS (
                    SELECT 1 FROM ROWS FROM (pg_catalog.unnest(held_keys),
                        pg_catalog.unnest(held_slots)) AS h(lock_key, slot)
                    WHERE h.lock_key = lock_keys[candidate] AND h.slot = slot_number
                ) THEN
                    IF pg_catalog.pg_try_advisory_lock(lock_keys[candidate], slot_number) THEN
                        found_slot := true;
                        EXIT;
                    END IF;
                END IF;
            END LOOP;
        END IF;
        IF found_slot THEN
            wanted_position := j - 1;
            queue_position := candidate - 1;
            granted_slot := slot_number;
            queue_state := 'granted';
            queue_limit := limits[candidate];
            RETURN NEXT;
            remaining := remaining - 1;
        ELSE
            refused[candidate] := true;
        END IF;
    END LOOP;
    FOR i IN 1 .. queue_count LOOP
        wanted_position := NULL;
        queue_position := i - 1;
        granted_slot := NULL;
        queue_state := CASE
            WHEN is_paused[i] THEN 'paused'
            WHEN refused[i] THEN 'full'
            ELSE 'open'
        END;
        queue_limit := limits[i];
        RETURN NEXT;
    END LOOP;
END;
$$

-- name: queue_claim
WITH requested AS (
    SELECT u.ordinal, coalesce(q.paused, false) AS paused, q.concurrency_limit
    FROM pg_catalog.unnest(%(queues)s::text[]) WITH ORDINALITY AS u(queue, ordinal)
    LEFT JOIN {queues} q ON q.queue = u.queue
)
SELECT c.wanted_position, c.queue_position, c.granted_slot, c.queue_state, c.queue_limit
FROM pg_temp.relayer_claim_slots(
    (SELECT coalesce(pg_catalog.bool_or(a.paused), false) FROM {queues} a WHERE a.queue = '*'),
    ARRAY(SELECT r.paused FROM requested r ORDER BY r.ordinal),
    ARRAY(SELECT r.concurrency_limit FROM requested r ORDER BY r.ordinal),
    %(keys)s::integer[],
    %(wanted)s::integer[],
    %(budget)s::integer,
    %(held_keys)s::integer[],
    %(held_slots)s::integer[],
    %(release_keys)s::integer[],
    %(release_slots)s::integer[]
) AS c

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
