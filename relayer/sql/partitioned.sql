-- Partitioned storage (storage = "partitioned", docs/storage.md): the outbox is partitioned by
-- range of id, sent rows stay where they are and each lane's progress advances past them.
-- A lane's progress is a pair: done_id, and snap, the snapshot of the statement that last
-- advanced it. Every outbox row of the lane whose id is at or below done_id and whose writing
-- transaction (the row's xid) is visible in snap is finished: sent, dropped by an operator, or
-- copied into the held table. Rows a lane passes without finishing them (a parked key's rows,
-- a failed row that will be retried, the rows after a batch's last outcome that were read but
-- not confirmed) are copied into the held table, deleted from it once sent. A lane's pending
-- rows, in id order: its held rows, its outbox rows above done_id, and its late rows: outbox
-- rows at or below done_id whose transaction snap did not see (it committed after the lane
-- passed their ids; ids are taken by writers before they commit). Per key the order is delete
-- mode's: a row is read once it is committed, in id order among the committed rows.
-- Partitions every lane has passed are detached and dropped
-- (relayer.store.partitions). Statements here replace relay.sql's of the same name without
-- the "partitioned_" prefix (relayer.store.relay.RelayStore).

-- name: partitioned_create_tables
-- A new partitioned store: the outbox migration 0001 made is replaced by a partitioned one of
-- the same columns (no DEFAULT partition: DETACH CONCURRENTLY refuses to run beside one), and
-- the progress and held tables are added. Runs inside apply's transaction, search_path pinned.
DROP TABLE {outbox};
CREATE TABLE {outbox} (
    id uuid NOT NULL,
    lane integer NOT NULL CHECK (lane >= -1),
    ordering_key text,
    transport text,
    destination text NOT NULL,
    body bytea NOT NULL,
    headers jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    deliver_at timestamptz,
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    -- The writing transaction: a lane's late rows are those its progress snapshot did not see.
    xid pg_catalog.xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    CHECK ((lane = -1) = (ordering_key IS NULL)),
    -- Unordered rows (lane -1) have no completion record in this mode yet: refused.
    CONSTRAINT partitioned_ordered_only CHECK (lane >= 0),
    PRIMARY KEY (lane, id)
) PARTITION BY RANGE (id);
-- A lane's late rows: an index range scan from its progress snapshot's xmin.
CREATE INDEX {outbox_xid} ON {outbox} (lane, xid);
CREATE TABLE {progress} (
    lane integer PRIMARY KEY CHECK (lane >= 0),
    -- Every row of the lane up to this id is sent, dropped, or copied into the held table.
    done_id uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    -- done_id before the lane's last batch with an outcome: that batch's acknowledged outbox
    -- rows are the ones above it (what the outcome statement's fence counts).
    previous_id uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    -- The snapshot of the statement that last advanced done_id: a row at or below done_id whose
    -- transaction it did not see is a late row, still pending (sees nothing at first).
    snap pg_catalog.pg_snapshot NOT NULL DEFAULT '1:1:',
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now()
) WITH (fillfactor = 50);
CREATE TABLE {held} (
    LIKE {outbox} INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (lane, id)
)

-- name: partitioned_storage_of
-- The outbox's kind: 'p' partitioned, 'r' a plain table (delete mode), no row: missing.
SELECT c.relkind::text FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = %(table)s

-- name: partitioned_clock
-- The database clock in Unix milliseconds: partitions are made ahead of it.
SELECT (extract(epoch FROM pg_catalog.now()) * 1000)::int8

-- name: partitioned_rotation_lock
-- One rotation of a store at a time: a session lock, held until the rotation's connection ends.
SELECT pg_catalog.pg_try_advisory_lock(%(key)s)

-- name: partitioned_ensure_progress_rows
INSERT INTO {progress} (lane)
SELECT lane FROM pg_catalog.generate_series(0, %(lanes)s - 1) AS lane
ON CONFLICT (lane) DO NOTHING

-- name: partitioned_list_partitions
-- The outbox's partitions: name, bound expression, and whether a DETACH CONCURRENTLY of it
-- was interrupted (it must be finished with DETACH ... FINALIZE).
SELECT c.relname::text, pg_catalog.pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending
FROM pg_catalog.pg_inherits AS i
JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = %(parent)s::regclass

-- name: partitioned_leftovers
-- Tables of the store's schema that a rotation marked (a comment on the partition, set before
-- it detaches it) and no longer attached to the outbox: detached by a rotation that ended before
-- it dropped them. A partition detached by anyone else is left alone.
SELECT c.relname::text FROM pg_catalog.pg_class AS c
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relkind = 'r' AND NOT c.relispartition
  AND pg_catalog.starts_with(c.relname, %(prefix)s)
  AND pg_catalog.obj_description(c.oid, 'pg_class') = %(mark)s

-- name: partitioned_low_water
-- The oldest outbox row any lane still has to pass (its first row above its progress, or its
-- oldest late row; none: NULL) and the database clock in Unix milliseconds. A partition whose
-- upper bound is at or below that row holds nothing a lane still needs (what a lane passed
-- unfinished is in the held table) but the rows of transactions still open, which rotation
-- copies into the held table after the detach has waited for them (partitioned_rescue); an
-- idle lane pins nothing. Unordered rows (lane -1) are refused in this mode.
SELECT (SELECT h.id::text FROM {progress} AS g
        CROSS JOIN LATERAL (
            (SELECT m.id FROM {outbox} AS m WHERE m.lane = g.lane AND m.id > g.done_id
             ORDER BY m.id LIMIT 1)
            UNION ALL
            (SELECT m.id FROM {outbox} AS m WHERE m.lane = g.lane AND {_late}
             ORDER BY m.id LIMIT 1)
        ) AS h
        ORDER BY h.id LIMIT 1),
       (extract(epoch FROM pg_catalog.now()) * 1000)::int8

-- name: _late
-- A fragment: outbox row m of the lane whose progress row is g is one of its late rows: at
-- or below the lane's done_id, written by a transaction the progress snapshot did not see
-- (so committed after the lane passed its id, or still open). Through the (lane, xid) index:
-- every transaction from the snapshot's xmin on, then each tested against the snapshot.
m.xid >= pg_catalog.pg_snapshot_xmin(g.snap) AND m.id <= g.done_id
AND NOT pg_catalog.pg_visible_in_snapshot(m.xid, g.snap)

-- name: _pending_outbox_row
-- A fragment: outbox row m of the lane whose progress row is g is pending (not held).
(m.id > g.done_id OR ({_late}))

-- name: partitioned_rescue
-- Rotation, after a partition's DETACH ... CONCURRENTLY has waited for every transaction that
-- used the outbox and before the partition is dropped: its pending rows (a row of a writer
-- whose transaction was still open when rotation found the partition passed) are copied into
-- the held table, where their lane reads them. {partition} is the detached table.
INSERT INTO {held}
SELECT m.* FROM {partition} AS m
JOIN {progress} AS g ON g.lane = m.lane
WHERE {_pending_outbox_row}
ON CONFLICT DO NOTHING

-- name: _pending_rows
-- A fragment: the first %(limit)s pending rows of lane l.lane whose progress row is g, in id
-- order, skipping keys parked and not yet due (as relay.sql's _sendable_rows): the first of
-- its held rows, of its outbox rows above g.done_id and of its late rows, merged. Each arm is
-- an index range scan with its own LIMIT (one UNION ALL under a single ORDER BY made the
-- planner read and sort a lane's whole backlog); g.done_id is a parameter of the nested
-- loop, so the partitions wholly below it (late rows: above it) are pruned at each rescan.
FROM (
    (SELECT h.* FROM {held} AS h
     WHERE h.lane = l.lane AND h.ordering_key NOT IN (
         SELECT p.ordering_key FROM {parked} AS p
         WHERE p.lane = l.lane AND (p.retry_at IS NULL OR p.retry_at > pg_catalog.now()))
     ORDER BY h.id LIMIT %(limit)s)
    UNION ALL
    (SELECT m.* FROM {outbox} AS m
     WHERE m.lane = l.lane AND m.id > g.done_id AND m.ordering_key NOT IN (
         SELECT p.ordering_key FROM {parked} AS p
         WHERE p.lane = l.lane AND (p.retry_at IS NULL OR p.retry_at > pg_catalog.now()))
     ORDER BY m.id LIMIT %(limit)s)
    UNION ALL
    (SELECT m.* FROM {outbox} AS m
     WHERE m.lane = l.lane AND {_late} AND m.ordering_key NOT IN (
         SELECT p.ordering_key FROM {parked} AS p
         WHERE p.lane = l.lane AND (p.retry_at IS NULL OR p.retry_at > pg_catalog.now()))
     ORDER BY m.id LIMIT %(limit)s)
) AS o
    ORDER BY o.id
    LIMIT %(limit)s

-- name: partitioned_holds_rows
-- An expression (as relay.sql's holds_rows): whether any lane holds a pending row.
(EXISTS (SELECT 1 FROM {held} AS h WHERE h.lane >= 0)
 OR EXISTS (SELECT 1 FROM {progress} AS g
            WHERE EXISTS (SELECT 1 FROM {outbox} AS m WHERE m.lane = g.lane AND m.id > g.done_id)
               OR EXISTS (SELECT 1 FROM {outbox} AS m WHERE m.lane = g.lane AND {_late})))

-- name: partitioned_probe
{_head_columns}
FROM pg_catalog.unnest(pg_catalog.string_to_array(%(lanes)s, ',')::int4[]) AS l(lane)
JOIN {progress} AS g ON g.lane = l.lane
LEFT JOIN LATERAL (
    SELECT o.id, o.deliver_at
    {_pending_rows}
) AS h ON true
LEFT JOIN {leases} AS s ON s.lane = l.lane

-- name: partitioned_probe_share
-- The heads of a member's share (as relay.sql's probe_share), lane by lane through the
-- progress table: a loose index scan of the outbox would walk each lane's passed rows.
{_head_columns}
FROM {progress} AS g
CROSS JOIN LATERAL (SELECT g.lane) AS l
JOIN LATERAL (
    SELECT o.id, o.deliver_at
    {_pending_rows}
) AS h ON true
LEFT JOIN {leases} AS s ON s.lane = l.lane
WHERE %(rank)s >= 0 AND g.lane >= %(first)s AND g.lane < %(end)s
  AND g.lane %% %(members)s = %(rank)s
  AND CASE WHEN g.lane < 8 * pg_catalog.octet_length(%(skip)s::bytea)
           THEN pg_catalog.get_bit(%(skip)s::bytea, g.lane) = 0
           ELSE true END

-- name: partitioned_read_batch
-- As relay.sql's read_batch, over the lane's pending rows.
SELECT l.lane, o.id::text, o.ordering_key, o.transport, o.destination, o.body,
       nullif(o.headers::text, '{{}}'),
       coalesce(o.deliver_at > pg_catalog.now(), false) AS future
FROM pg_catalog.unnest(pg_catalog.string_to_array(%(lanes)s, ',')::int4[]) AS l(lane)
JOIN {leases} AS s ON s.lane = l.lane AND s.owner = %(member)s AND s.expires_at > pg_catalog.now()
JOIN {progress} AS g ON g.lane = l.lane
CROSS JOIN LATERAL (
    SELECT o.*
    {_pending_rows}
) AS o

-- name: _outcome_inputs
-- A fragment: the fenced lanes (whose lease token still holds), and the acknowledged and
-- failed rows of those lanes, as relay.sql's record_outcomes reads them.
WITH fence AS (
    SELECT s.lane FROM {leases} AS s
    JOIN ROWS FROM (pg_catalog.unnest(pg_catalog.string_to_array(%(lanes)s, ',')::int4[]),
                    pg_catalog.unnest(pg_catalog.string_to_array(%(tokens)s, ',')::uuid[]))
        AS t(lane, token)
        ON s.lane = t.lane AND s.token = t.token
    WHERE s.owner = %(member)s
), acked AS (
    SELECT * FROM ROWS FROM (
        pg_catalog.unnest(pg_catalog.string_to_array(%(acked_lanes)s, ',')::int4[]),
        pg_catalog.unnest(pg_catalog.string_to_array(%(acked)s, ',')::uuid[])
    ) AS a(lane, id)
    WHERE a.lane IN (SELECT lane FROM fence)
), failure AS (
    SELECT * FROM pg_catalog.jsonb_to_recordset(%(failures)s::jsonb)
        AS f(lane int4, id uuid, error text, permanent bool)
    WHERE f.lane IN (SELECT lane FROM fence)
)

-- name: partitioned_advance
-- The first of the two statements of a batch's outcomes (sent together, with the COMMIT; the
-- second, partitioned_record_outcomes, refuses to commit unless every lease held): each fenced
-- lane's progress advances to its batch's last row with an outcome (acknowledged or failed;
-- previous_id keeps where it was) and takes this statement's snapshot, and the rows that
-- leaves behind unfinished are copied into the held table, where the second statement counts
-- the failures and deletes what was acknowledged: the lane's outbox rows it passes that were
-- not acknowledged (failed rows; rows of parked keys the read skipped; rows read but not
-- confirmed), and every late row the old snapshot did not see and this one does (sent in this
-- batch or not). Nothing is deleted from the outbox. A row this snapshot does not see (its
-- transaction still open) stays a late row of the lane.
{_outcome_inputs}, reach AS MATERIALIZED (
    -- PostgreSQL has no max(uuid) before 17; a UUID's text sorts as the UUID does.
    SELECT g.lane, g.done_id AS old_id, g.snap AS old_snap,
           greatest(g.done_id, x.top) AS new_id
    FROM (SELECT lane, pg_catalog.max(id::text)::uuid AS top
          FROM (SELECT lane, id FROM acked UNION ALL SELECT lane, id FROM failure) AS x
          GROUP BY lane) AS x
    JOIN {progress} AS g ON g.lane = x.lane
), advanced AS (
    UPDATE {progress} AS g
    SET done_id = reach.new_id, previous_id = reach.old_id,
        snap = pg_catalog.pg_current_snapshot(), updated_at = pg_catalog.now()
    FROM reach
    WHERE g.lane = reach.lane
)
-- NOT IN over an uncorrelated subquery: one hashed lookup per row (a generic plan joined
-- NOT EXISTS as a nested loop over every acknowledged row: 20 ms for 500 rows).
INSERT INTO {held}
SELECT m.* FROM reach
JOIN {outbox} AS m ON m.lane = reach.lane AND m.id > reach.old_id AND m.id <= reach.new_id
WHERE (m.lane, m.id) NOT IN (SELECT lane, id FROM acked)
UNION ALL
SELECT m.* FROM reach
JOIN {outbox} AS m ON m.lane = reach.lane
    AND m.xid >= pg_catalog.pg_snapshot_xmin(reach.old_snap) AND m.id <= reach.old_id
    AND NOT pg_catalog.pg_visible_in_snapshot(m.xid, reach.old_snap)

-- name: partitioned_record_outcomes
-- The second statement (see partitioned_advance, whose changes it sees): as relay.sql's
-- record_outcomes, where every failed row is in the held table now and an acknowledged row
-- is deleted from the held table if it is there (it stays in the outbox, below its lane's
-- progress, until its partition is dropped). Fenced and returning as record_outcomes.
{_outcome_inputs}, sent_held AS (
    DELETE FROM {held} AS o USING acked
    WHERE o.lane = acked.lane AND o.id = acked.id
    RETURNING o.id
), sent AS (
    -- An acknowledged row not held is one of the outbox rows the advance just passed.
    SELECT (SELECT pg_catalog.count(*) FROM sent_held) + (
        SELECT pg_catalog.count(*) FROM acked JOIN {progress} AS g ON g.lane = acked.lane
        WHERE acked.id > g.previous_id AND acked.id <= g.done_id
          AND acked.id NOT IN (SELECT id FROM sent_held)) AS n
), counted AS (
    UPDATE {held} AS o
    SET attempts = o.attempts + 1, last_error = failure.error
    FROM failure
    WHERE o.lane = failure.lane AND o.id = failure.id
    RETURNING o.id, o.lane, o.ordering_key, o.attempts, failure.error, failure.permanent
), parked AS (
    INSERT INTO {parked} AS p (ordering_key, lane, head_id, attempts, last_error, retry_at)
    SELECT ordering_key, lane, id, attempts, error,
           CASE WHEN permanent OR attempts >= %(max_attempts)s THEN NULL
                ELSE pg_catalog.now() + least(%(backoff)s * pg_catalog.power(2, least(attempts - 1, 20)), %(backoff_max)s)
           END
    FROM counted
    ON CONFLICT (ordering_key) DO UPDATE
        SET head_id = EXCLUDED.head_id, attempts = EXCLUDED.attempts,
            last_error = EXCLUDED.last_error, retry_at = EXCLUDED.retry_at, updated_at = pg_catalog.now()
    RETURNING lane, retry_at IS NULL AS gave_up
), unparked AS (
    DELETE FROM {parked}
    WHERE lane IN (SELECT lane FROM fence) AND head_id IN (SELECT id FROM acked)
      AND ordering_key NOT IN (SELECT ordering_key FROM counted)
    RETURNING 1
)
SELECT (SELECT n FROM sent),
       (SELECT pg_catalog.count(*) FROM counted),
       (SELECT coalesce(pg_catalog.array_agg(lane), ARRAY[]::int4[]) FROM parked WHERE gave_up),
       (SELECT pg_catalog.count(*) FROM unparked),
       -- relay.sql's fence: every lane's lease held and every acknowledged row found.
       CASE WHEN (SELECT pg_catalog.count(*) FROM fence) = %(lane_count)s
                 AND (SELECT n FROM sent) = %(expected)s
            THEN 0
            ELSE ('relayer-fence: lane ' || pg_catalog.replace(%(lanes)s, ',', ', ')
                  || ': the fenced progress matched ' || (SELECT n FROM sent)
                  || ' of ' || %(expected)s || ' rows (lease held: '
                  || CASE WHEN (SELECT pg_catalog.count(*) FROM fence) = %(lane_count)s
                          THEN 'yes' ELSE 'no' END
                  || '); rolled back, the rows will be sent again')::int4
       END

-- name: _pending_all
-- A fragment: every pending row of every lane (held rows, outbox rows above their lane's
-- progress and its late rows), as a FROM item named o: what delete mode's outbox holds.
(SELECT h.* FROM {held} AS h
 UNION ALL
 SELECT m.* FROM {outbox} AS m JOIN {progress} AS g ON g.lane = m.lane
 WHERE {_pending_outbox_row})
AS o

-- name: partitioned_status_pending
SELECT lane, pg_catalog.count(*), greatest(extract(epoch FROM pg_catalog.now() - pg_catalog.min(created_at)), 0)::float8
FROM {_pending_all}
GROUP BY lane
ORDER BY lane NULLS LAST

-- name: partitioned_status_summary
WITH pending AS MATERIALIZED (SELECT o.created_at FROM {_pending_all})
SELECT (SELECT pg_catalog.count(*) FROM pending)::int8,
       (SELECT greatest(extract(epoch FROM pg_catalog.now() - pg_catalog.min(created_at)), 0)::float8 FROM pending),
       (SELECT pg_catalog.count(*) FROM {parked})::int8,
       (SELECT pg_catalog.count(*) FROM {parked} WHERE retry_at IS NULL)::int8,
       (SELECT pg_catalog.count(*) FROM {leases} WHERE lane IS NULL AND expires_at >= pg_catalog.now())::int8

-- name: partitioned_parked_list
SELECT p.ordering_key, p.lane, p.attempts, p.last_error, p.retry_at, p.parked_at, p.head_id,
       (SELECT pg_catalog.count(*) FROM {held} AS h
        WHERE h.lane = p.lane AND h.ordering_key = p.ordering_key)
       + (SELECT pg_catalog.count(*) FROM {outbox} AS m JOIN {progress} AS g ON g.lane = m.lane
          WHERE m.lane = p.lane AND {_pending_outbox_row} AND m.ordering_key = p.ordering_key)
FROM {parked} AS p
WHERE %(key)s::text IS NULL OR p.ordering_key = %(key)s
ORDER BY p.parked_at, p.ordering_key

-- name: _key_rows_above_progress
-- A fragment: the pending outbox rows of key %(key)s of lane unparked.lane (above its
-- progress, or late: a row the lane passed is in the held table, or was sent).
FROM {outbox} AS m
JOIN {progress} AS g ON g.lane = m.lane
JOIN unparked ON unparked.lane = m.lane
WHERE {_pending_outbox_row} AND m.ordering_key = %(key)s

-- name: partitioned_redrive_key
-- As operations.sql's redrive_key: the key's held rows get a fresh attempt count (its rows
-- above the progress never failed: a failed row is held). Returns the key's pending rows.
WITH unparked AS (
    DELETE FROM {parked} WHERE ordering_key = %(key)s RETURNING lane, head_id
), held AS (
    UPDATE {held} AS o SET attempts = 0
    FROM unparked
    WHERE o.lane = unparked.lane AND o.ordering_key = %(key)s
    RETURNING o.id
)
SELECT id FROM held
UNION ALL
SELECT m.id {_key_rows_above_progress}

-- name: partitioned_drop_key
-- As operations.sql's drop_key: the key's held rows and its rows above the progress go (an
-- operator's action, rare: the few dead tuples in the outbox go with its partition).
WITH unparked AS (
    DELETE FROM {parked} WHERE ordering_key = %(key)s RETURNING lane
), held AS (
    DELETE FROM {held} AS o USING unparked
    WHERE o.lane = unparked.lane AND o.ordering_key = %(key)s
    RETURNING o.id
), above AS (
    DELETE FROM {outbox} AS o
    WHERE (o.lane, o.id) IN (SELECT m.lane, m.id {_key_rows_above_progress})
    RETURNING o.id
)
SELECT id FROM held UNION ALL SELECT id FROM above

-- name: partitioned_drop_head_key
-- As operations.sql's drop_head_key: the parked head is a held row (a failed row is held).
WITH unparked AS (
    DELETE FROM {parked} WHERE ordering_key = %(key)s RETURNING lane, head_id
)
DELETE FROM {held} AS o
USING unparked
WHERE o.lane = unparked.lane AND o.id = unparked.head_id
RETURNING o.id

-- name: partitioned_drop_expired_parked_key
-- As maintenance.sql's drop_expired_parked_key, dropping as partitioned_drop_key does.
WITH unparked AS (
    DELETE FROM {parked}
    WHERE ordering_key = %(key)s AND retry_at IS NULL AND updated_at < pg_catalog.now() - %(retention)s
    RETURNING lane, head_id, attempts, last_error, updated_at
), held AS (
    DELETE FROM {held} AS o USING unparked
    WHERE o.lane = unparked.lane AND o.ordering_key = %(key)s
    RETURNING o.id
), above AS (
    DELETE FROM {outbox} AS o
    WHERE (o.lane, o.id) IN (SELECT m.lane, m.id {_key_rows_above_progress})
    RETURNING o.id
)
SELECT (SELECT pg_catalog.count(*) FROM held) + (SELECT pg_catalog.count(*) FROM above),
       head_id, attempts, last_error, extract(epoch FROM pg_catalog.now() - updated_at)::float8
FROM unparked

-- name: partitioned_metrics_backlog
-- As metrics.sql's metrics_backlog, over each owned lane's pending rows (held, above its
-- progress, late): its count, and the age of its head (the oldest of its first held row, its
-- first row above the progress and its first late row).
WITH owned AS (
    SELECT l.lane FROM pg_catalog.unnest(%(lanes)s::integer[]) AS l(lane)
), counted AS (
    SELECT g.lane, pg_catalog.count(*) AS rows
    FROM owned JOIN {progress} AS g ON g.lane = owned.lane
    CROSS JOIN LATERAL (
        SELECT 1 FROM {held} AS h WHERE h.lane = g.lane
        UNION ALL
        SELECT 1 FROM {outbox} AS m WHERE m.lane = g.lane AND {_pending_outbox_row}
    ) AS x
    GROUP BY g.lane
), pending AS (
    SELECT c.lane, c.rows,
           greatest(extract(epoch FROM pg_catalog.now() - h.created_at), 0)::float8 AS age
    FROM counted AS c
    JOIN {progress} AS g ON g.lane = c.lane
    CROSS JOIN LATERAL (
        SELECT o.created_at FROM (
            (SELECT h.id, h.created_at FROM {held} AS h WHERE h.lane = c.lane
             ORDER BY h.id LIMIT 1)
            UNION ALL
            (SELECT m.id, m.created_at FROM {outbox} AS m WHERE m.lane = c.lane AND m.id > g.done_id
             ORDER BY m.id LIMIT 1)
            UNION ALL
            (SELECT m.id, m.created_at FROM {outbox} AS m WHERE m.lane = c.lane AND {_late}
             ORDER BY m.id LIMIT 1)
        ) AS o
        ORDER BY o.id LIMIT 1
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

-- name: _partitioned_store_health
-- As maintenance.sql's _store_health, the oldest due row taken from each lane's pending rows
-- (held, above its progress, late: the outbox keeps sent rows until their partition goes).
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
           SELECT pg_catalog.max(greatest(extract(epoch FROM pg_catalog.now() - greatest(d.created_at, d.deliver_at)), 0))::float8
           FROM {progress} AS g
           CROSS JOIN LATERAL (
               SELECT o.created_at, o.deliver_at FROM (
                   (SELECT h.id, h.created_at, h.deliver_at FROM {held} AS h
                    WHERE h.lane = g.lane AND (h.deliver_at IS NULL OR h.deliver_at <= pg_catalog.now())
                    ORDER BY h.id LIMIT 1)
                   UNION ALL
                   (SELECT m.id, m.created_at, m.deliver_at FROM {outbox} AS m
                    WHERE m.lane = g.lane AND m.id > g.done_id
                      AND (m.deliver_at IS NULL OR m.deliver_at <= pg_catalog.now())
                    ORDER BY m.id LIMIT 1)
                   UNION ALL
                   (SELECT m.id, m.created_at, m.deliver_at FROM {outbox} AS m
                    WHERE m.lane = g.lane AND {_late}
                      AND (m.deliver_at IS NULL OR m.deliver_at <= pg_catalog.now())
                    ORDER BY m.id LIMIT 1)
               ) AS o
               ORDER BY o.id LIMIT 1
           ) AS d
       ), 0)::float8,
       (SELECT rows FROM failing),
       (SELECT attempts FROM failing),
       (SELECT last_error FROM {outbox} WHERE lane = -1 AND attempts > 0 ORDER BY id DESC LIMIT 1)

-- name: partitioned_store_health
{_partitioned_store_health}

-- name: partitioned_store_health_and_retention
-- As maintenance.sql's store_health_and_retention (the same retention tests).
{_partitioned_store_health},
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
