-- The metrics' backlog statements (relayer.metrics). A worker asks only about the lanes it owns,
-- so however many workers run, the cluster reads each lane once per metrics interval. Empty
-- lanes cost one index probe each (the join with the owned lanes); a lane with rows also one
-- head-row read through (lane, id). The answer is one row whatever the lane count: totals and
-- the `top` lanes whose head row is oldest, so a scrape stays small with 65,536 lanes.

-- name: metrics_backlog
-- Over the owned lanes: pending rows, the oldest head row's age, lanes with rows, parked keys and
-- those that wait for an operator (max_attempts reached or a permanent error), then the lane,
-- rows and head age of the `top` lanes whose head row is oldest (ties: the lower lane first).
WITH owned AS (
    SELECT l.lane FROM pg_catalog.unnest(%(lanes)s::integer[]) AS l(lane)
), counted AS (
    SELECT o.lane, pg_catalog.count(*) AS rows
    FROM owned JOIN {outbox} o ON o.lane = owned.lane
    GROUP BY o.lane
), pending AS (
    SELECT c.lane, c.rows,
           greatest(extract(epoch FROM pg_catalog.now() - h.created_at), 0)::float8 AS age
    FROM counted c
    CROSS JOIN LATERAL (
        SELECT o.created_at FROM {outbox} o WHERE o.lane = c.lane ORDER BY o.id LIMIT 1
    ) AS h
), parked AS (
    SELECT pg_catalog.count(*) AS keys, pg_catalog.count(*) FILTER (WHERE p.retry_at IS NULL) AS waiting
    FROM owned JOIN {parked} p ON p.lane = owned.lane
)
SELECT coalesce((SELECT pg_catalog.sum(rows) FROM pending), 0)::bigint,
       coalesce((SELECT pg_catalog.max(age) FROM pending), 0)::float8,
       (SELECT pg_catalog.count(*) FROM pending),
       parked.keys,
       parked.waiting,
       ARRAY(SELECT lane FROM pending ORDER BY age DESC, lane LIMIT %(top)s),
       ARRAY(SELECT rows FROM pending ORDER BY age DESC, lane LIMIT %(top)s),
       ARRAY(SELECT age FROM pending ORDER BY age DESC, lane LIMIT %(top)s)
FROM parked

-- name: metrics_unordered_backlog
-- Rows without an ordering key (lane -1), through the primary key (lane, id).
SELECT (SELECT pg_catalog.count(*) FROM {outbox} WHERE lane = -1),
       coalesce((SELECT greatest(extract(epoch FROM pg_catalog.now() - o.created_at), 0)::float8
                 FROM {outbox} o WHERE o.lane = -1 ORDER BY o.id LIMIT 1), 0)
