-- The dashboard's reads (relayer dashboard). Same format and namespace as queries.sql; every
-- name starts with dash_. Built-in functions are qualified with pg_catalog, values are bound,
-- and no statement counts a whole table on the sampler's path: counts are capped (LIMIT inside)
-- or refined in the background (dash_lane_counts).

-- name: dash_members
-- Live members: instance, since, last heartbeat and its age on the database clock.
SELECT owner, acquired_at, renewed_at, expires_at,
       greatest(extract(epoch FROM pg_catalog.now() - renewed_at), 0)::float8
FROM {leases}
WHERE lane IS NULL AND expires_at >= pg_catalog.now()
ORDER BY owner

-- name: dash_lane_map
-- Every busy lane's heat-map byte (state << 5 | age bucket, relayer/dashboard/lanes.py) and
-- the owners of the live lane leases, in one statement. The heads of the lanes holding rows
-- come from a loose index scan (one descent per busy lane, not one per lane); a head's age is
-- the time in its UUIDv7 id. States: 1 flowing, 2 waiting (future-dated head),
-- 3 unowned, 5 retrying, 6 parked; stalled (4) needs earlier snapshots, so flowing lanes whose head is at
-- least %(stall_after)s seconds old come back as candidates (lane, the id's random tail) for
-- the sampler to compare. Arrays aggregated in one pass are aligned.
WITH RECURSIVE busy(lane, id, deliver_at) AS (
    (SELECT o.lane, o.id, o.deliver_at FROM {outbox} AS o
     WHERE o.lane >= 0 ORDER BY o.lane, o.id LIMIT 1)
    UNION ALL
    SELECT next.lane, next.id, next.deliver_at
    FROM busy,
    LATERAL (
        SELECT o.lane, o.id, o.deliver_at FROM {outbox} AS o
        WHERE o.lane > busy.lane ORDER BY o.lane, o.id LIMIT 1
    ) AS next
), {_lane_map}

-- name: _lane_map
-- A fragment: the heat map of dash_lane_map from its busy lanes (kept apart for readability).
clock AS MATERIALIZED (
    SELECT pg_catalog.now() AS now, (extract(epoch FROM pg_catalog.now()) * 1000)::int8 AS ms
), owned AS MATERIALIZED (
    SELECT s.lane, s.owner
    FROM {leases} AS s, clock
    WHERE s.lane IS NOT NULL AND s.owner <> '' AND s.expires_at > clock.now
), waiting AS (
    SELECT p.lane, pg_catalog.bool_or(p.retry_at IS NULL) AS operator
    FROM (SELECT lane, retry_at FROM {parked} LIMIT %(cap)s) AS p
    GROUP BY p.lane
), heads AS MATERIALIZED (
    SELECT coalesce(b.lane, w.lane) AS lane,
           CASE WHEN b.id IS NULL THEN 0 ELSE greatest(
               clock.ms - (('x' || pg_catalog.encode(pg_catalog.substr(
                   pg_catalog.uuid_send(b.id), 1, 8), 'hex'))::bit(64)::int8 >> 16),
               0) END / 1000.0 AS age,
           CASE WHEN w.lane IS NOT NULL THEN CASE WHEN w.operator THEN 6 ELSE 5 END
                WHEN b.deliver_at > clock.now THEN 2
                WHEN NOT EXISTS (SELECT 1 FROM owned AS o WHERE o.lane = b.lane) THEN 3
                ELSE 1 END AS state,
           b.id
    FROM busy AS b
    FULL JOIN waiting AS w ON w.lane = b.lane
    CROSS JOIN clock
)
SELECT (SELECT ms FROM clock),
       coalesce(pg_catalog.array_agg(lane), '{{}}'),
       coalesce(pg_catalog.array_agg((state << 5) | least(31, pg_catalog.floor(
           2 * pg_catalog.ln(1 + age) / pg_catalog.ln(2)))::int), '{{}}'),
       (SELECT coalesce(pg_catalog.array_agg(ARRAY[state, n]), '{{}}')
        FROM (SELECT state, pg_catalog.count(*)::int4 AS n FROM heads GROUP BY state) AS c),
       (SELECT coalesce(pg_catalog.array_agg(owner), '{{}}') FROM (
            SELECT owner FROM owned GROUP BY owner ORDER BY owner) AS names),
       (SELECT coalesce(pg_catalog.array_agg(lanes), '{{}}') FROM (
            SELECT pg_catalog.array_to_string(pg_catalog.array_agg(lane), ',') AS lanes
            FROM owned GROUP BY owner ORDER BY owner) AS groups),
       (SELECT coalesce(pg_catalog.array_agg(ARRAY[lane, age]::float8[] ORDER BY age DESC, lane),
                 '{{}}')
        FROM (SELECT lane, age FROM heads WHERE id IS NOT NULL
              ORDER BY age DESC, lane LIMIT %(top)s) AS t),
       (SELECT coalesce(pg_catalog.array_agg(ARRAY[lane::int8,
                   ('x' || pg_catalog.encode(pg_catalog.substr(
                       pg_catalog.uuid_send(id), 9, 8), 'hex'))::bit(64)::int8]), '{{}}')
        FROM heads WHERE state = 1 AND age >= %(stall_after)s)
FROM heads

-- name: dash_unordered_head
-- The oldest unordered row's age in seconds (lane -1, through the primary key).
SELECT greatest(extract(epoch FROM pg_catalog.now() - created_at), 0)::float8
FROM {outbox}
WHERE lane = -1
ORDER BY id
LIMIT 1

-- name: dash_parked_totals
-- Parked keys (at most %(cap)s read) and how many of them wait for an operator.
SELECT pg_catalog.count(*)::int8, pg_catalog.count(*) FILTER (WHERE retry_at IS NULL)::int8
FROM (SELECT retry_at FROM {parked} LIMIT %(cap)s) AS p

-- name: dash_pending_capped
-- Pending rows, counted up to %(cap)s (the page shows "10,000+" beyond).
SELECT pg_catalog.count(*)::int8 FROM (SELECT 1 FROM {outbox} LIMIT %(cap)s) AS capped

-- name: dash_table_counters
-- The outbox's estimated size and its cumulative insert/update/delete counters: deletes are
-- rows sent (or dropped), updates are failed attempts (or redrives), inserts rows written.
SELECT greatest(c.reltuples, 0)::int8,
       coalesce(s.n_live_tup, 0)::int8,
       coalesce(s.n_tup_ins, 0)::int8,
       coalesce(s.n_tup_upd, 0)::int8,
       coalesce(s.n_tup_del, 0)::int8
FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_stat_user_tables AS s ON s.relid = c.oid
WHERE n.nspname = %(schema)s AND c.relname = %(table)s

-- name: dash_batches_open
-- Batch transactions open now on the store's workers (their connections are named per store).
SELECT pg_catalog.count(*)::int4
FROM pg_catalog.pg_stat_activity
WHERE datname = pg_catalog.current_database() AND application_name = %(application)s
  AND xact_start IS NOT NULL

-- name: dash_lane_counts
-- Pending rows per lane: a whole-table read, so only the background refinement runs it, under
-- a statement timeout.
SELECT coalesce(pg_catalog.array_agg(lane), '{{}}'), coalesce(pg_catalog.array_agg(rows), '{{}}')
FROM (SELECT lane, pg_catalog.count(*)::int8 AS rows FROM {outbox} GROUP BY lane) AS counted

-- name: dash_statement_timeout
SELECT pg_catalog.set_config('statement_timeout', %(timeout)s, true)

-- name: dash_lane_lease
-- A lane nobody took yet has the expiry '-infinity' (which Python cannot represent): NULL.
SELECT owner, CASE WHEN pg_catalog.isfinite(expires_at) THEN expires_at END, acquired_at,
       renewed_at, expires_at > pg_catalog.now()
FROM {leases}
WHERE lane = %(lane)s

-- name: dash_lane_rows
-- A lane's first rows, head first, without their bodies.
SELECT id, ordering_key, transport, destination, attempts, last_error, deliver_at, created_at,
       pg_catalog.octet_length(body), coalesce(deliver_at > pg_catalog.now(), false)
FROM {outbox}
WHERE lane = %(lane)s
ORDER BY id
LIMIT %(limit)s

-- name: dash_lane_pending
SELECT pg_catalog.count(*)::int8
FROM (SELECT 1 FROM {outbox} WHERE lane = %(lane)s LIMIT %(cap)s) AS capped

-- name: dash_key_rows
-- A key's pending rows in the order they will be sent, without their bodies.
SELECT id, ordering_key, transport, destination, attempts, last_error, deliver_at, created_at,
       pg_catalog.octet_length(body), coalesce(deliver_at > pg_catalog.now(), false)
FROM {outbox}
WHERE lane = %(lane)s AND ordering_key = %(key)s
ORDER BY id
LIMIT %(limit)s

-- name: dash_key_pending
SELECT pg_catalog.count(*)::int8
FROM (SELECT 1 FROM {outbox} WHERE lane = %(lane)s AND ordering_key = %(key)s LIMIT %(cap)s)
    AS capped

-- name: dash_row_body
-- One row's body, capped at %(cap)s bytes, and its full size and headers.
SELECT pg_catalog.substr(body, 1, %(cap)s), pg_catalog.octet_length(body), headers::text
FROM {outbox}
WHERE lane = %(lane)s AND id = %(id)s

-- name: _parked_filter
-- A fragment: the parked-list filters (NULL: not filtered), for page and count alike.
WHERE p.parked_at <= %(as_of)s
      AND (%(error)s::text IS NULL
           OR pg_catalog.strpos(pg_catalog.lower(p.last_error), pg_catalog.lower(%(error)s)) > 0)
      AND (%(lane)s::int4 IS NULL OR p.lane = %(lane)s)
      AND (%(destination)s::text IS NULL OR h.destination = %(destination)s)
      AND (%(transport)s::text IS NULL OR coalesce(h.transport, '') = %(transport)s)
      AND (%(state)s::text IS NULL OR (%(state)s = 'operator') = (p.retry_at IS NULL))

-- name: dash_parked_page
-- One keyset page of parked keys in parking order, as of the moment the search began (keys
-- parked later never shift the pages).
SELECT p.ordering_key, p.lane, p.attempts, p.last_error, p.retry_at, p.parked_at, p.head_id,
       h.destination, h.transport
FROM {parked} AS p
LEFT JOIN {outbox} AS h ON h.lane = p.lane AND h.id = p.head_id
{_parked_filter}
      AND (%(after_at)s::timestamptz IS NULL
           OR (p.parked_at, p.ordering_key) > (%(after_at)s, %(after_key)s::text))
ORDER BY p.parked_at, p.ordering_key
LIMIT %(limit)s

-- name: dash_parked_count
SELECT pg_catalog.count(*)::int8
FROM (
    SELECT 1 FROM {parked} AS p
    LEFT JOIN {outbox} AS h ON h.lane = p.lane AND h.id = p.head_id
    {_parked_filter}
    LIMIT %(cap)s
) AS capped

-- name: dash_parked_groups
-- The errors most keys are parked with (their first 200 characters), top 20, each with the
-- whole text of one of its keys' errors (its first 2,000 characters).
SELECT pg_catalog.left(last_error, 200) AS error, pg_catalog.count(*)::int8,
       pg_catalog.count(*) FILTER (WHERE retry_at IS NULL)::int8, pg_catalog.min(parked_at),
       pg_catalog.left(pg_catalog.min(last_error), 2000)
FROM (SELECT last_error, retry_at, parked_at FROM {parked} LIMIT %(cap)s) AS p
GROUP BY 1
ORDER BY 2 DESC, 1
LIMIT 20

-- name: dash_parked_key
SELECT p.ordering_key, p.lane, p.attempts, p.last_error, p.retry_at, p.parked_at, p.head_id,
       p.updated_at, h.destination, h.transport
FROM {parked} AS p
LEFT JOIN {outbox} AS h ON h.lane = p.lane AND h.id = p.head_id
WHERE p.ordering_key = %(key)s

-- name: dash_now
SELECT pg_catalog.now()

-- name: dash_queue_holders
-- Who holds the slots of limited queues now: advisory locks (queue key, slot) per session.
SELECT l.classid::int8, l.objid::int4, a.pid, a.application_name,
       coalesce(pg_catalog.host(a.client_addr), 'local'), a.backend_start
FROM pg_catalog.pg_locks AS l
JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
  AND l.database = (SELECT oid FROM pg_catalog.pg_database
                    WHERE datname = pg_catalog.current_database())
  AND l.classid::int8 = ANY(%(keys)s::int8[])
ORDER BY l.classid, l.objid

-- name: dash_index_sizes
SELECT t.relname, i.relname, pg_catalog.pg_relation_size(i.oid)::int8,
       coalesce(s.idx_scan, 0)::int8
FROM pg_catalog.pg_index AS x
JOIN pg_catalog.pg_class AS i ON i.oid = x.indexrelid
JOIN pg_catalog.pg_class AS t ON t.oid = x.indrelid
JOIN pg_catalog.pg_namespace AS n ON n.oid = t.relnamespace
LEFT JOIN pg_catalog.pg_stat_user_indexes AS s ON s.indexrelid = i.oid
WHERE n.nspname = %(schema)s AND t.relname = ANY(%(tables)s)
ORDER BY t.relname, i.relname

-- name: dash_audit
-- Every operator change, newest first: parked-key changes ({audit}) and queue changes
-- ({queue_events}, whose actor starts with 'dashboard:' when the dashboard made them).
SELECT occurred_at, source, actor, action, target, rows_affected, reason, outcome, detail
FROM (
    SELECT a.occurred_at, a.source, a.actor, a.action, 'key ' || a.ordering_key AS target,
           a.rows_affected, a.reason, a.outcome,
           'head ' || coalesce(a.head_id::text, '-') || ', attempts '
               || coalesce(a.attempts::text, '-') AS detail
    FROM {audit} AS a
    UNION ALL
    SELECT q.occurred_at,
           CASE WHEN pg_catalog.starts_with(q.actor, 'dashboard:') THEN 'dashboard' ELSE 'cli' END,
           q.actor, q.action, 'queue ' || q.queue, NULL, q.reason, 'applied',
           CASE WHEN q.action = 'limit'
                THEN 'limit ' || coalesce(q.concurrency_limit::text, 'none') END
    FROM {queue_events} AS q
) AS changes
WHERE (%(text)s::text IS NULL
       OR pg_catalog.strpos(pg_catalog.lower(actor || ' ' || action || ' ' || target || ' '
                                             || coalesce(reason, '')),
                            pg_catalog.lower(%(text)s)) > 0)
  AND (%(action)s::text IS NULL OR action = %(action)s)
ORDER BY occurred_at DESC
LIMIT %(limit)s
