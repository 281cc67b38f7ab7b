-- The ordered relay's statements: membership, lane leases, probe, batch read, outcomes, and
-- the operator's views. Every write made under a lane lease is fenced by the owner's token.
-- Durations are bound as intervals; every time comparison uses the database clock (now()).

-- name: ensure_lane_rows
-- One lease row per lane, so a batch can lock its lane with SKIP LOCKED. Idempotent.
INSERT INTO {leases} (name, lane, owner, token, expires_at)
SELECT 'lane:' || lane, lane, '', '00000000-0000-0000-0000-000000000000', '-infinity'
FROM pg_catalog.generate_series(0, %(lanes)s - 1) AS lane
ON CONFLICT (name) DO NOTHING

-- name: trim_lane_rows
DELETE FROM {leases} WHERE lane >= %(lanes)s

-- name: heartbeat
-- Renew this member, drop expired members, give up the held lanes outside the share the live
-- members give it now (as release_lanes does, in the same statement: one round trip per beat),
-- and return the live members in rank order, each row with how many lanes were released.
-- The rank is the number of live members sorted before this one: the position of this member
-- in the rows returned (the same collation orders both).
WITH beat AS (
    INSERT INTO {leases} (name, owner, token, expires_at)
    VALUES ('member:' || %(member)s, %(member)s, %(token)s, pg_catalog.now() + %(lease)s)
    ON CONFLICT (name) DO UPDATE
        SET expires_at = EXCLUDED.expires_at, renewed_at = pg_catalog.now()
    RETURNING owner
), expired AS (
    DELETE FROM {leases}
    WHERE lane IS NULL AND expires_at < pg_catalog.now() AND name <> 'member:' || %(member)s
), live AS (
    SELECT owner FROM {leases}
    WHERE lane IS NULL AND expires_at >= pg_catalog.now() AND name <> 'member:' || %(member)s
    UNION
    SELECT owner FROM beat
), share AS MATERIALIZED (
    SELECT pg_catalog.count(*) AS members,
           pg_catalog.count(*) FILTER (WHERE owner < %(member)s) AS rank
    FROM live
), released AS (
    -- The share is read once (not once per lease row), and a lone member, whose share is
    -- every lane, reads no lease row at all.
    UPDATE {leases} SET expires_at = '-infinity', renewed_at = pg_catalog.now()
    WHERE name IN (
        SELECT l.name FROM {leases} AS l
        WHERE (SELECT members FROM share) > 1
          AND l.lane IS NOT NULL AND l.owner = %(member)s AND l.expires_at > pg_catalog.now()
          AND l.lane %% (SELECT members FROM share) <> (SELECT rank FROM share)
        FOR UPDATE OF l SKIP LOCKED
    )
    RETURNING 1
)
SELECT owner, (SELECT pg_catalog.count(*) FROM released) FROM live
ORDER BY 1

-- name: leave
-- Graceful shutdown: release every lane this member holds and its membership.
WITH lanes AS (
    UPDATE {leases} SET expires_at = '-infinity', renewed_at = pg_catalog.now()
    WHERE lane IS NOT NULL AND owner = %(member)s
)
DELETE FROM {leases} WHERE name = 'member:' || %(member)s

-- name: release_lanes
-- Give up held lanes outside this member's share at once (rows locked by a batch are skipped:
-- that batch finishes first and calls this again; the next heartbeat does it too).
-- The share is given as (rank, members): lane %% members = rank (no array of up to 65,536
-- lanes to bind and search); a rank below 0 keeps nothing.
UPDATE {leases} SET expires_at = '-infinity', renewed_at = pg_catalog.now()
WHERE name IN (
    SELECT name FROM {leases}
    WHERE lane IS NOT NULL AND owner = %(member)s AND expires_at > pg_catalog.now()
      AND (%(rank)s < 0 OR lane %% %(members)s <> %(rank)s)
    FOR UPDATE SKIP LOCKED
)

-- name: holds_rows
-- An expression, not a statement: whether any lane holds a row (through the primary key; the
-- unordered rows' lane -1 is left out). An idle store's poll asks this before it probes its
-- share; the stores of a database are asked together, one column each of one SELECT
-- (relayer.store.housekeeping).
EXISTS (SELECT 1 FROM {outbox} AS o WHERE o.lane >= 0)

-- name: _sendable_rows
-- A fragment (names starting with _ are pasted into the queries that name them): the rows of
-- lane l.lane in id order, skipping keys parked and not yet due for a retry. The waiting keys
-- are a hashed set built once per lane (ordering_key is never NULL in a lane, so NOT IN is
-- exact).
FROM {outbox} AS o
    WHERE o.lane = l.lane
      AND o.ordering_key NOT IN (
          SELECT p.ordering_key FROM {parked} AS p
          WHERE p.lane = l.lane AND (p.retry_at IS NULL OR p.retry_at > pg_catalog.now())
      )
    ORDER BY o.id

-- name: _head_columns
-- A fragment: what a probe returns for lane l.lane, from its head h and its lease row s, in
-- the order of relayer.store.LaneHead's fields and as their types (a probe of a whole share
-- returns a row for every busy lane, tens of thousands under a backlog: no conversion per row).
SELECT l.lane,
       h.id IS NOT NULL AS has_head,
       coalesce(h.deliver_at > pg_catalog.now(), false) AS future,
       CASE WHEN h.deliver_at > pg_catalog.now() AND pg_catalog.isfinite(h.deliver_at)
            THEN extract(epoch FROM h.deliver_at - pg_catalog.now())::float8 ELSE 0 END AS due_in,
       nullif(s.owner, '') AS owner,
       coalesce(s.expires_at > pg_catalog.now(), false) AS lease_live,
       CASE WHEN s.expires_at > pg_catalog.now() AND pg_catalog.isfinite(s.expires_at)
            THEN extract(epoch FROM s.expires_at - pg_catalog.now())::float8 ELSE 0 END AS lease_left

-- name: probe
-- Read-only: for each lane, its first non-parked head and the lane lease's holder.
{_head_columns}
FROM pg_catalog.unnest(pg_catalog.string_to_array(%(lanes)s, ',')::int4[]) AS l(lane)
LEFT JOIN LATERAL (
    SELECT o.id, o.deliver_at
    {_sendable_rows}
    LIMIT 1
) AS h ON true
LEFT JOIN {leases} AS s ON s.lane = l.lane

-- name: probe_share
-- The same, for a member's whole share (up to 65,536 lanes), given as (rank, members): the
-- lanes with lane %% members = rank. A loose index scan first finds the lanes that hold any row
-- (one index descent per busy lane, not per lane), and only those of the share are probed,
-- except the lanes whose bit is set in %(skip)s (a bytea, bit lane %% 8 of byte lane / 8; lanes
-- past its end are probed): the worker already knows their heads are due. Lanes without rows
-- are not returned. Only lanes from %(first)s up to (not including) %(end)s are looked at, so
-- that a large share can be probed in parts.
-- The loose index scan's step reads each busy lane's first row: that row is the head unless
-- its key is parked and not yet due (one lookup in the parked table), so the head is looked
-- for again, past parked keys, only then (the second branch runs only if the first gave no
-- row): a third less database time than looking up every busy lane's head anew.
WITH RECURSIVE busy(lane, id, ordering_key, deliver_at) AS (
    (SELECT o.lane, o.id, o.ordering_key, o.deliver_at FROM {outbox} AS o
     WHERE o.lane >= %(first)s AND o.lane < %(end)s
     ORDER BY o.lane, o.id LIMIT 1)
    UNION ALL
    SELECT next.*
    FROM busy,
    LATERAL (
        SELECT o.lane, o.id, o.ordering_key, o.deliver_at FROM {outbox} AS o
        WHERE o.lane > busy.lane AND o.lane < %(end)s
        ORDER BY o.lane, o.id LIMIT 1
    ) AS next
)
{_head_columns}
FROM busy AS l
JOIN LATERAL (
    SELECT l.id, l.deliver_at
    WHERE NOT EXISTS (
        SELECT FROM {parked} AS p
        WHERE p.ordering_key = l.ordering_key AND p.lane = l.lane
          AND (p.retry_at IS NULL OR p.retry_at > pg_catalog.now())
    )
    UNION ALL
    (SELECT o.id, o.deliver_at
    {_sendable_rows}
    LIMIT 1)
    LIMIT 1
) AS h ON true
LEFT JOIN {leases} AS s ON s.lane = l.lane
WHERE %(rank)s >= 0 AND l.lane %% %(members)s = %(rank)s
  AND CASE WHEN l.lane < 8 * pg_catalog.octet_length(%(skip)s::bytea)
           THEN pg_catalog.get_bit(%(skip)s::bytea, l.lane) = 0
           ELSE true END

-- name: lock_lanes
-- Take, renew or keep the leases of a group of lanes and lock their rows for the whole batch.
-- Never waits: a lease row locked by another transaction (a batch still in flight, even past
-- its expiry) is skipped, and so is a lane another live member holds. A lease of this member
-- with more than half of it left is only locked, not rewritten (a batch never outlives half a
-- lease); any other is taken or renewed for a whole lease, keeping its token while it is this
-- member's and live. Returns the lanes locked, each with its token as text (the outcome
-- statement's fence takes tokens as text: no UUID object is made and printed per lane).
-- A lease to rewrite is found again by the tuple id its lock was taken on: the row stays
-- locked by this transaction, so that version is the current one, and the rewrite needs no
-- second descent of the primary key (a third less time for a group of leases to renew). Were
-- it not current, the rewrite would match nothing and the lane would be left out, not taken.
WITH candidates AS (
    SELECT ctid, lane, token, owner = %(member)s AND expires_at > pg_catalog.now() + %(lease)s / 2 AS fresh
    FROM {leases}
    WHERE lane = ANY(pg_catalog.string_to_array(%(lanes)s, ',')::int4[])
      AND (owner = %(member)s OR expires_at < pg_catalog.now())
    ORDER BY lane
    FOR UPDATE SKIP LOCKED
), renewed AS (
    UPDATE {leases} AS s
    SET owner = %(member)s,
        token = CASE WHEN s.owner = %(member)s AND s.expires_at > pg_catalog.now() THEN s.token
                     ELSE %(token)s END,
        acquired_at = CASE WHEN s.owner = %(member)s AND s.expires_at > pg_catalog.now()
                           THEN s.acquired_at ELSE pg_catalog.now() END,
        expires_at = pg_catalog.now() + %(lease)s,
        renewed_at = pg_catalog.now()
    FROM candidates AS c
    WHERE s.ctid = c.ctid AND NOT c.fresh
    RETURNING s.lane, s.token
)
SELECT lane, token::text FROM renewed
UNION ALL
SELECT lane, token::text FROM candidates WHERE fresh

-- name: read_batch
-- Each lane's head rows, read by a statement of its own after lock_lanes (so with a snapshot
-- taken after the locks: a previous holder's deletes and parks that committed just before are
-- seen), head first, at most %(limit)s per lane, skipping parked keys that are not due for a
-- retry. Only lanes this member holds return rows; the caller also drops lanes whose lock was
-- skipped.
-- Ids travel as text (the transports send them as text; the outcome statement casts them
-- back), empty headers as NULL: the client then decodes no UUID and no JSON for most rows.
-- No ORDER BY over the whole result: sorting thousands of wide rows took a quarter of the
-- statement's time. A lane's rows come out together and in id order all the same: the lateral
-- subquery (ORDER BY, LIMIT) runs once per lane, as the inner side of a nested loop, which
-- emits each run of inner rows as it is produced. The lanes come out in the order the plan
-- visits them (the order of %(lanes)s with every plan seen); the client puts them in order
-- if they are not (relayer.store.LaneRows.from_rows).
SELECT l.lane, o.id::text, o.ordering_key, o.transport, o.destination, o.body,
       nullif(o.headers::text, '{{}}'),
       coalesce(o.deliver_at > pg_catalog.now(), false) AS future
FROM pg_catalog.unnest(pg_catalog.string_to_array(%(lanes)s, ',')::int4[]) AS l(lane)
JOIN {leases} AS s ON s.lane = l.lane AND s.owner = %(member)s AND s.expires_at > pg_catalog.now()
CROSS JOIN LATERAL (
    SELECT o.*
    {_sendable_rows}
    LIMIT %(limit)s
) AS o

-- name: record_outcomes
-- One fenced statement for a batch of one or more lanes: delete acknowledged rows, count a
-- failure on each failed head row and park its key with a retry time (NULL after max_attempts
-- or a permanent error), and unpark keys whose parked head was just acknowledged. Every lane's
-- lease token must still hold. Returns how many rows each part touched, and the lane of each
-- key that reached max_attempts.
WITH fence AS (
    SELECT s.lane FROM {leases} AS s
    JOIN ROWS FROM (pg_catalog.unnest(pg_catalog.string_to_array(%(lanes)s, ',')::int4[]),
                    pg_catalog.unnest(pg_catalog.string_to_array(%(tokens)s, ',')::uuid[]))
        AS t(lane, token)
        ON s.lane = t.lane AND s.token = t.token
    WHERE s.owner = %(member)s
), acked AS (
    -- Lanes and ids come as comma-separated text: one string each is far cheaper to bind
    -- than an array parameter of thousands of elements.
    SELECT * FROM ROWS FROM (
        pg_catalog.unnest(pg_catalog.string_to_array(%(acked_lanes)s, ',')::int4[]),
        pg_catalog.unnest(pg_catalog.string_to_array(%(acked)s, ',')::uuid[])
    ) AS a(lane, id)
    WHERE a.lane IN (SELECT lane FROM fence)
), deleted AS (
    DELETE FROM {outbox} AS o
    USING acked
    WHERE o.lane = acked.lane AND o.id = acked.id
    RETURNING o.id
), failure AS (
    -- One JSON array of objects with lane, id, error and permanent (usually empty).
    SELECT * FROM pg_catalog.jsonb_to_recordset(%(failures)s::jsonb)
        AS f(lane int4, id uuid, error text, permanent bool)
    WHERE f.lane IN (SELECT lane FROM fence)
), counted AS (
    UPDATE {outbox} AS o
    SET attempts = o.attempts + 1, last_error = failure.error
    FROM failure
    WHERE o.lane = failure.lane AND o.id = failure.id
    RETURNING o.id, o.lane, o.ordering_key, o.attempts, failure.error, failure.permanent
), parked AS (
    INSERT INTO {parked} AS p (ordering_key, lane, head_id, attempts, last_error, retry_at)
    SELECT ordering_key, lane, id, attempts, error,
           CASE WHEN permanent OR attempts >= %(max_attempts)s THEN NULL
                -- The exponent is capped: 2^20 backoffs exceed any backoff_max (at most 7 days),
                -- and an unbounded power would overflow the interval after a few dozen attempts.
                ELSE pg_catalog.now() + least(%(backoff)s * pg_catalog.power(2, least(attempts - 1, 20)), %(backoff_max)s)
           END
    FROM counted
    ON CONFLICT (ordering_key) DO UPDATE
        SET head_id = EXCLUDED.head_id, attempts = EXCLUDED.attempts,
            last_error = EXCLUDED.last_error, retry_at = EXCLUDED.retry_at, updated_at = pg_catalog.now()
    RETURNING lane, retry_at IS NULL AS gave_up
), unparked AS (
    -- A key whose retried head went through is free again, unless a later row of it failed
    -- in this same batch (then "parked" above re-parks it).
    DELETE FROM {parked}
    WHERE lane IN (SELECT lane FROM fence) AND head_id IN (SELECT id FROM acked)
      AND ordering_key NOT IN (SELECT ordering_key FROM counted)
    RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM deleted),
       (SELECT pg_catalog.count(*) FROM counted),
       (SELECT coalesce(pg_catalog.array_agg(lane), ARRAY[]::int4[]) FROM parked WHERE gave_up),
       (SELECT pg_catalog.count(*) FROM unparked),
       -- Fails (and so aborts the transaction, whose COMMIT was sent with this statement)
       -- unless every lane's lease still held and every acknowledged row was deleted: the text
       -- cast to an integer is the error's message (relayer.store.FENCE_MARK).
       CASE WHEN (SELECT pg_catalog.count(*) FROM fence) = %(lane_count)s
                 AND (SELECT pg_catalog.count(*) FROM deleted) = %(expected)s
            THEN 0
            ELSE ('relayer-fence: lane ' || pg_catalog.replace(%(lanes)s, ',', ', ')
                  || ': the fenced delete matched ' || (SELECT pg_catalog.count(*) FROM deleted)
                  || ' of ' || %(expected)s || ' rows (lease held: '
                  || CASE WHEN (SELECT pg_catalog.count(*) FROM fence) = %(lane_count)s
                          THEN 'yes' ELSE 'no' END
                  || '); rolled back, the rows will be sent again')::int4
       END
