-- The dashboard's reads of a partitioned store (storage = "partitioned", docs/storage.md): each
-- replaces dashboard.sql's statement of the same name without the "partitioned_" prefix. The
-- outbox keeps sent rows until their partition is dropped, so every count, list, head and age
-- here reads the pending rows ({_pending_all}: held rows, and outbox rows above their lane's
-- progress), never the outbox alone. Counts stay capped as in dashboard.sql.

-- name: partitioned_dash_lane_map
-- As dash_lane_map: the busy lanes are the lanes of the progress table (one row per lane) that
-- have a pending row, each with its first pending row, by id. Its first row above the progress
-- (an index descent per partition not pruned) bounds that read: a pending row of the lane comes before it or is it, so
-- the pending rows read and sorted are the held ones (few) and that one, not every pending row
-- of the lane (sorting those made a snapshot of 500,000 pending rows take seconds). With none
-- above the progress the bound is the largest UUID. (OFFSET 0 keeps the bound a value the
-- planner can push into the pending rows' scans.)
WITH busy AS (
    SELECT lp.lane, d.id, d.deliver_at
    FROM {progress} AS lp
    CROSS JOIN LATERAL (
        SELECT coalesce((
            SELECT a.id FROM {outbox} AS a
            WHERE a.lane = lp.lane AND a.id > lp.done_id
            ORDER BY a.id
            LIMIT 1
        ), 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid) AS id
        OFFSET 0
    ) AS bound
    CROSS JOIN LATERAL (
        SELECT o.id, o.deliver_at FROM {_pending_all}
        WHERE o.lane = lp.lane AND o.id <= bound.id
        ORDER BY o.id
        LIMIT 1
    ) AS d
), {_lane_map}

-- name: partitioned_dash_pending_capped
-- Pending rows, counted up to %(cap)s.
SELECT pg_catalog.count(*)::int8 FROM (SELECT 1 FROM {_pending_all} LIMIT %(cap)s) AS capped

-- name: partitioned_dash_table_counters
-- As dash_table_counters, for what a partitioned store has: no planner estimate of its pending
-- rows (0: the sampler takes the last full count instead); inserts are the rows written into
-- the outbox's partitions attached now (a dropped partition takes its counter with it: the
-- chart skips that point); updates are the held table's (failed attempts, or redrives);
-- deletes are not rows sent here (the sampler counts those as rows written minus the change
-- in pending rows), so 0.
SELECT 0::int8, 0::int8,
       coalesce(pg_catalog.sum(pg_catalog.pg_stat_get_tuples_inserted(i.inhrelid)), 0)::int8,
       coalesce((SELECT pg_catalog.pg_stat_get_tuples_updated(c.oid)
                 FROM pg_catalog.pg_class AS c
                 JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
                 WHERE n.nspname = %(schema)s AND c.relname = %(held)s), 0)::int8,
       0::int8
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_inherits AS i ON i.inhparent = c.oid
WHERE n.nspname = %(schema)s AND c.relname = %(table)s
GROUP BY c.oid

-- name: partitioned_dash_lane_counts
-- As dash_lane_counts (the background refinement, under a statement timeout).
SELECT coalesce(pg_catalog.array_agg(lane), '{{}}'), coalesce(pg_catalog.array_agg(rows), '{{}}')
FROM (SELECT o.lane, pg_catalog.count(*)::int8 AS rows FROM {_pending_all} GROUP BY o.lane)
    AS counted

-- name: partitioned_dash_lane_rows
-- A lane's first pending rows, head first, without their bodies. Bounded as in
-- partitioned_dash_lane_map, by its %(limit)s-th row above the progress: the first %(limit)s
-- pending rows come before it or are it.
SELECT o.id, o.ordering_key, o.transport, o.destination, o.attempts, o.last_error,
       o.deliver_at, o.created_at, pg_catalog.octet_length(o.body),
       coalesce(o.deliver_at > pg_catalog.now(), false)
FROM {_pending_all}
WHERE o.lane = %(lane)s AND o.id <= coalesce((
    SELECT a.id FROM {outbox} AS a
    WHERE a.lane = %(lane)s
      AND a.id > (SELECT p.done_id FROM {progress} AS p WHERE p.lane = %(lane)s)
    ORDER BY a.id
    OFFSET %(limit)s - 1
    LIMIT 1
), 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid)
ORDER BY o.id
LIMIT %(limit)s

-- name: partitioned_dash_lane_pending
SELECT pg_catalog.count(*)::int8
FROM (SELECT 1 FROM {_pending_all} WHERE o.lane = %(lane)s LIMIT %(cap)s) AS capped

-- name: partitioned_dash_key_rows
-- A key's pending rows in the order they will be sent, without their bodies.
SELECT o.id, o.ordering_key, o.transport, o.destination, o.attempts, o.last_error,
       o.deliver_at, o.created_at, pg_catalog.octet_length(o.body),
       coalesce(o.deliver_at > pg_catalog.now(), false)
FROM {_pending_all}
WHERE o.lane = %(lane)s AND o.ordering_key = %(key)s
ORDER BY o.id
LIMIT %(limit)s

-- name: partitioned_dash_key_pending
SELECT pg_catalog.count(*)::int8
FROM (SELECT 1 FROM {_pending_all} WHERE o.lane = %(lane)s AND o.ordering_key = %(key)s
      LIMIT %(cap)s) AS capped

-- name: partitioned_dash_row_body
-- A pending row's body (a sent row is gone for the dashboard, as in delete mode).
SELECT pg_catalog.substr(o.body, 1, %(cap)s), pg_catalog.octet_length(o.body), o.headers::text
FROM {_pending_all}
WHERE o.lane = %(lane)s AND o.id = %(id)s
LIMIT 1

-- name: partitioned_dash_parked_page
-- As dash_parked_page, the head row (its destination and transport) read among the pending
-- rows (a fragment cannot hold another: the pending rows fragment is written in each of the
-- three statements that read the head).
SELECT p.ordering_key, p.lane, p.attempts, p.last_error, p.retry_at, p.parked_at, p.head_id,
       h.destination, h.transport
FROM {parked} AS p
LEFT JOIN LATERAL (
    SELECT o.destination, o.transport FROM {_pending_all}
    WHERE o.lane = p.lane AND o.id = p.head_id
    LIMIT 1
) AS h ON true
{_parked_filter}
      AND (%(after_at)s::timestamptz IS NULL
           OR (p.parked_at, p.ordering_key) > (%(after_at)s, %(after_key)s::text))
ORDER BY p.parked_at, p.ordering_key
LIMIT %(limit)s

-- name: partitioned_dash_parked_count
SELECT pg_catalog.count(*)::int8
FROM (
    SELECT 1 FROM {parked} AS p
    LEFT JOIN LATERAL (
        SELECT o.destination, o.transport FROM {_pending_all}
        WHERE o.lane = p.lane AND o.id = p.head_id
        LIMIT 1
    ) AS h ON true
    {_parked_filter}
    LIMIT %(cap)s
) AS capped

-- name: partitioned_dash_parked_key
SELECT p.ordering_key, p.lane, p.attempts, p.last_error, p.retry_at, p.parked_at, p.head_id,
       p.updated_at, h.destination, h.transport
FROM {parked} AS p
LEFT JOIN LATERAL (
    SELECT o.destination, o.transport FROM {_pending_all}
    WHERE o.lane = p.lane AND o.id = p.head_id
    LIMIT 1
) AS h ON true
WHERE p.ordering_key = %(key)s
