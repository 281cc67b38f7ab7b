-- The consumer inbox and per-key sequence numbers (writer side and consumer side).

-- name: reserve_sequences
-- Writer, in the caller's transaction: reserve `count` numbers per key. The upsert locks each
-- key's counter row until that transaction ends, so numbers are gapless and follow commit order
-- per key; keys are locked in sorted order, so two batches never deadlock on each other.
-- It runs under the application's search_path, so its types and operator are qualified too.
INSERT INTO {sequences} AS s (ordering_key, last_sequence)
SELECT r.key, r.count
FROM ROWS FROM (pg_catalog.unnest(%(keys)s::pg_catalog.text[]),
    pg_catalog.unnest(%(counts)s::pg_catalog.int8[])) AS r(key, count)
ORDER BY r.key
ON CONFLICT (ordering_key) DO UPDATE
    SET last_sequence = s.last_sequence OPERATOR(pg_catalog.+) excluded.last_sequence,
        updated_at = pg_catalog.now()
RETURNING ordering_key, last_sequence

-- name: inbox_claim
-- Consumer, in the consumer's transaction. A second claim of the same id waits for the first
-- transaction and, once that committed, conflicts: a duplicate. For a new message with a key and
-- a sequence number, the key's last number is read under a row lock (claims of one key take
-- turns) and then advanced; the caller compares the two.
WITH claimed AS (
    INSERT INTO {inbox} (consumer, message_id) VALUES (%(consumer)s, %(message_id)s)
    ON CONFLICT DO NOTHING
    RETURNING 1
), previous AS MATERIALIZED (
    SELECT (
        SELECT k.last_sequence FROM {inbox_keys} AS k
        WHERE k.consumer = %(consumer)s AND k.ordering_key = %(key)s
        FOR UPDATE
    ) AS last_sequence
    FROM claimed
    WHERE %(sequence)s::int8 IS NOT NULL
), advanced AS (
    INSERT INTO {inbox_keys} AS k (consumer, ordering_key, last_sequence)
    SELECT %(consumer)s, %(key)s, %(sequence)s::int8 FROM previous
    ON CONFLICT (consumer, ordering_key) DO UPDATE
        SET last_sequence = greatest(k.last_sequence, excluded.last_sequence), updated_at = pg_catalog.now()
)
SELECT EXISTS (SELECT 1 FROM claimed), (SELECT last_sequence FROM previous)

-- name: inbox_expire
-- Retention, oldest first, in bounded batches.
DELETE FROM {inbox}
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM {inbox}
    WHERE received_at < pg_catalog.now() - %(retention)s
    ORDER BY received_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)

-- name: inbox_keys_expire
DELETE FROM {inbox_keys}
WHERE (consumer, ordering_key) IN (
    SELECT consumer, ordering_key FROM {inbox_keys}
    WHERE updated_at < pg_catalog.now() - %(retention)s
    ORDER BY updated_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)

-- name: sequences_expire
-- Forget counters of keys idle for longer than sequence_retention that have no pending row (the
-- key's next write starts again at 1). Counters locked by a writer are skipped.
DELETE FROM {sequences}
WHERE ordering_key IN (
    SELECT s.ordering_key FROM {sequences} AS s
    WHERE s.updated_at < pg_catalog.now() - %(retention)s
      AND NOT EXISTS (SELECT 1 FROM {outbox} AS o WHERE o.ordering_key = s.ordering_key)
    ORDER BY s.updated_at
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
)
