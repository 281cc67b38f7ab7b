-- Unordered rows (no ordering key, lane -1): sent after commit by the application and, when it
-- did not, by the workers' maintenance. Every sender claims rows with FOR UPDATE SKIP LOCKED and
-- keeps them locked until its outcomes commit, so no row is ever sent by two senders at once.

-- name: unordered_claim_ids
-- The rows an application just committed (a rolled-back write has no row to claim).
SELECT id, transport, destination, body, headers::text
FROM {outbox}
WHERE id = ANY(%(ids)s::uuid[]) AND lane = -1
  AND (deliver_at IS NULL OR deliver_at <= pg_catalog.now())
ORDER BY id
FOR UPDATE SKIP LOCKED

-- name: unordered_claim_due
-- Recovery: rows the application did not send within the grace period, future-dated rows once
-- due, failed rows once their retry time came. Oldest first, through the unordered index.
SELECT id, transport, destination, body, headers::text
FROM {outbox}
WHERE lane = -1 AND coalesce(deliver_at, created_at + %(grace)s) <= pg_catalog.now()
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: unordered_due_exists
-- Whether recovery has anything to claim, read without a lock on the worker's housekeeping
-- connection: a store without such rows then takes no batch connection for its recovery.
-- The second column says whether any unordered row waits at all (due later, say within its
-- grace): an idle store's recovery looks less often only while there is none.
SELECT EXISTS (
    SELECT 1 FROM {outbox}
    WHERE lane = -1 AND coalesce(deliver_at, created_at + %(grace)s) <= pg_catalog.now()
), EXISTS (SELECT 1 FROM {outbox} WHERE lane = -1)

-- name: unordered_settle
-- Under the claim's row locks: delete what the broker acknowledged, and give each failed row its
-- attempt, error and retry time in deliver_at (exponential backoff; the maximum at once for a
-- permanent error; the exponent stops at 20 so the interval cannot overflow). Unordered rows
-- never wait for an operator: nothing queues behind them.
WITH deleted AS (
    DELETE FROM {outbox} WHERE id = ANY(%(acked)s::uuid[]) AND lane = -1 RETURNING 1
), failure AS (
    SELECT * FROM ROWS FROM (pg_catalog.unnest(%(failed)s::uuid[]),
        pg_catalog.unnest(%(errors)s::text[]),
        pg_catalog.unnest(%(permanent)s::bool[]))
        AS f(id, error, permanent)
), retried AS (
    UPDATE {outbox} AS o
    SET attempts = o.attempts + 1,
        last_error = failure.error,
        deliver_at = pg_catalog.now() + CASE
            WHEN failure.permanent THEN %(backoff_max)s
            ELSE least(%(backoff)s * pg_catalog.power(2, least(o.attempts, 20)), %(backoff_max)s)
        END
    FROM failure
    WHERE o.id = failure.id AND o.lane = -1
    RETURNING 1
)
SELECT (SELECT pg_catalog.count(*) FROM deleted), (SELECT pg_catalog.count(*) FROM retried)
