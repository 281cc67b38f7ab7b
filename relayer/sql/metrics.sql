-- The metrics' backlog statements (relayer.metrics). A worker asks only about the lanes it owns,
-- so however many workers run, the cluster reads each lane once per metrics interval; every
-- subquery is an index scan of one lane: (lane, id) on the outbox, (lane, ordering_key) on
-- parked keys.

-- name: metrics_lane_backlog
-- Per lane: pending rows, age of the head row (the lane's oldest by id), parked keys, and parked
-- keys that wait for an operator (max_attempts reached or a permanent error).
SELECT l.lane,
       (SELECT pg_catalog.count(*) FROM {outbox} o WHERE o.lane = l.lane),
       coalesce((SELECT greatest(extract(epoch FROM pg_catalog.now() - o.created_at), 0)::float8
                 FROM {outbox} o WHERE o.lane = l.lane ORDER BY o.id LIMIT 1), 0),
       (SELECT pg_catalog.count(*) FROM {parked} p WHERE p.lane = l.lane),
       (SELECT pg_catalog.count(*) FROM {parked} p WHERE p.lane = l.lane AND p.retry_at IS NULL)
FROM pg_catalog.unnest(%(lanes)s::integer[]) AS l(lane)
ORDER BY l.lane

-- name: metrics_unordered_backlog
-- Rows without an ordering key (lane -1), through the primary key (lane, id).
SELECT (SELECT pg_catalog.count(*) FROM {outbox} WHERE lane = -1),
       coalesce((SELECT greatest(extract(epoch FROM pg_catalog.now() - o.created_at), 0)::float8
                 FROM {outbox} o WHERE o.lane = -1 ORDER BY o.id LIMIT 1), 0)
