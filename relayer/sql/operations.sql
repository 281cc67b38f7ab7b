-- Operator statements: status and parked-key control. Parked-key changes lock the lane's lease
-- row first, so they wait for a batch in flight on that lane instead of racing it.

-- name: status_members
SELECT owner, expires_at, greatest(extract(epoch FROM pg_catalog.now() - acquired_at), 0)::float8
FROM {leases}
WHERE lane IS NULL AND expires_at >= pg_catalog.now()
ORDER BY owner

-- name: status_lane_owners
SELECT lane, owner, expires_at
FROM {leases}
WHERE lane IS NOT NULL AND owner <> '' AND expires_at > pg_catalog.now()
ORDER BY lane

-- name: status_pending
SELECT lane, pg_catalog.count(*), greatest(extract(epoch FROM pg_catalog.now() - pg_catalog.min(created_at)), 0)::float8
FROM {outbox}
GROUP BY lane
ORDER BY lane NULLS LAST

-- name: status_summary
SELECT (SELECT pg_catalog.count(*) FROM {outbox})::int8,
       (SELECT greatest(extract(epoch FROM pg_catalog.now() - pg_catalog.min(created_at)), 0)::float8 FROM {outbox}),
       (SELECT pg_catalog.count(*) FROM {parked})::int8,
       (SELECT pg_catalog.count(*) FROM {parked} WHERE retry_at IS NULL)::int8,
       (SELECT pg_catalog.count(*) FROM {leases} WHERE lane IS NULL AND expires_at >= pg_catalog.now())::int8

-- name: parked_list
SELECT p.ordering_key, p.lane, p.attempts, p.last_error, p.retry_at, p.parked_at, p.head_id,
       (SELECT pg_catalog.count(*) FROM {outbox} o WHERE o.lane = p.lane AND o.ordering_key = p.ordering_key)
FROM {parked} AS p
WHERE %(key)s::text IS NULL OR p.ordering_key = %(key)s
ORDER BY p.parked_at, p.ordering_key

-- name: lock_lane_for_operator
SELECT 1 FROM {leases} WHERE lane = %(lane)s FOR UPDATE

-- name: redrive_key
-- The key flows again from its head, in id order, with a fresh attempt count.
WITH unparked AS (
    DELETE FROM {parked} WHERE ordering_key = %(key)s RETURNING lane, head_id
)
UPDATE {outbox} AS o SET attempts = 0
FROM unparked
WHERE o.lane = unparked.lane AND o.ordering_key = %(key)s
RETURNING o.id

-- name: drop_key
WITH unparked AS (
    DELETE FROM {parked} WHERE ordering_key = %(key)s RETURNING lane
)
DELETE FROM {outbox} AS o
USING unparked
WHERE o.lane = unparked.lane AND o.ordering_key = %(key)s
RETURNING o.id

-- name: parked_key_state
-- A parked key's lane, head row and attempts (read again after its lane is locked).
SELECT lane, head_id, attempts FROM {parked} WHERE ordering_key = %(key)s

-- name: drop_head_key
-- Only the parked head row goes; the key flows again from its next row, in order.
WITH unparked AS (
    DELETE FROM {parked} WHERE ordering_key = %(key)s RETURNING lane, head_id
)
DELETE FROM {outbox} AS o
USING unparked
WHERE o.lane = unparked.lane AND o.id = unparked.head_id
RETURNING o.id

-- name: audit_record
INSERT INTO {audit} (source, actor, action, ordering_key, lane, head_id, attempts,
                     rows_affected, reason, outcome)
VALUES (%(source)s, %(actor)s, %(action)s, %(key)s, %(lane)s, %(head_id)s, %(attempts)s,
        %(rows)s, %(reason)s, %(outcome)s)
