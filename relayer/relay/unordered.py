"""Sending unordered rows: claim, publish concurrently, settle the outcomes; one transaction.

Rows without an ordering key carry no ordering promise. The application sends the ones it just
committed (``relayer.writer.after_commit``); the workers' maintenance sends whatever is left
once it is older than ``unordered_grace`` (an application that died, a broker that was down).
Both go through :class:`UnorderedSender`:

1. claim the rows with ``FOR UPDATE SKIP LOCKED``, so two senders never hold the same row and
   neither waits for the other (nor for any lane: unordered rows have no lane);
2. publish every claimed row at once and wait for the acknowledgements until the batch
   deadline (``lease_duration / 2``, keeping an eighth of the lease for the commit);
3. in one statement, delete the acknowledged rows and give each failed row an attempt, its error
   and a retry time (``deliver_at``: exponential backoff from ``retry_backoff`` up to
   ``retry_backoff_max``, the maximum at once for a permanent error);
4. commit. Rows neither acknowledged nor failed in time, and every row when the broker could not
   be reached, stay as they were: no attempt is counted and recovery sends them later.

Any doubt about the database outcome rolls back; the rows are sent again later (at-least-once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from uuid import UUID

from relayer.deadlines import Deadlines
from relayer.errors import StoreError
from relayer.observability.throttle import ThrottledLog, shape
from relayer.redact import redact
from relayer.settings import StoreSettings
from relayer.store import Claimed, Connection, Failure, UnorderedStore, abandon
from relayer.transports.routing import Fault, Routing, Verdict, classify

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class UnorderedResult:
    """What one dispatch or recovery pass did with unordered rows."""

    claimed: int = 0
    sent: int = 0
    failed: int = 0
    unresolved: int = 0  # published, but neither acknowledged nor failed before the deadline
    error: str = ""  # why the pass stopped early (broker unreachable, database trouble)

    def __add__(self, other: UnorderedResult) -> UnorderedResult:
        return UnorderedResult(
            self.claimed + other.claimed,
            self.sent + other.sent,
            self.failed + other.failed,
            self.unresolved + other.unresolved,
            self.error or other.error,
        )


@dataclass(slots=True)
class UnorderedReport:
    """What became of the rows one pass published: the acknowledged ids, the failures (with
    their errors), how many were neither in time, and why the broker could not be used."""

    acked: list[UUID] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    unresolved: int = 0
    unavailable: str = ""


class UnorderedSender:
    """Sends batches of one store's unordered rows through its ``routing`` (started
    transports)."""

    def __init__(self, store: StoreSettings, routing: Routing) -> None:
        self.store = store
        self.routing = routing
        self.db = UnorderedStore(store)
        deadlines = Deadlines.of(store.lease_duration)
        self.deadline = deadlines.batch
        self.commit_reserve = deadlines.commit_reserve
        # A broker or database that is down fails every pass alike: one line per cause.
        self.log = ThrottledLog(logger)

    async def send_ids(self, conn: Connection, ids: Sequence[UUID]) -> UnorderedResult:
        """Send the rows with these ids that exist, are due and are not held by another sender."""
        return await self._batch(conn, lambda: self.db.claim_ids(conn, ids))

    async def recover(self, conn: Connection, limit: int) -> UnorderedResult:
        """Send up to ``limit`` rows that are older than the grace period or due again."""
        return await self._batch(conn, lambda: self.db.claim_due(conn, limit))

    async def _batch(
        self, conn: Connection, claim: Callable[[], Awaitable[list[Claimed]]]
    ) -> UnorderedResult:
        """One claim-send-settle transaction on ``conn`` (autocommit off). Never raises for
        database or broker trouble: the result says what happened."""
        started = time.monotonic()
        claimed = 0
        try:
            async with asyncio.timeout(self.deadline):
                messages = await claim()
                claimed = len(messages)
                if not messages:
                    await self.db.end(conn)
                    return UnorderedResult()
                wait_until = started + self.deadline - self.commit_reserve
                report = await self.publish(messages, wait_until)
                sent, failed = await self._settle(conn, report)
        except (TimeoutError, StoreError) as exc:  # FencedWriteError is a StoreError
            await abandon(conn)
            detail = "deadline passed" if isinstance(exc, TimeoutError) else redact(str(exc))
            self.log.warning(
                ("unordered_rollback", shape(detail)),
                "store %s: unordered batch of %s rows rolled back (%s); they are sent again later",
                self.store.name,
                claimed,
                detail,
                extra={"action": "unordered_rollback", "store": self.store.name, "rows": claimed},
            )
            return UnorderedResult(claimed, error=detail)
        self._log(report)
        return UnorderedResult(claimed, sent, failed, report.unresolved, report.unavailable)

    async def _settle(self, conn: Connection, report: UnorderedReport) -> tuple[int, int]:
        if not report.acked and not report.failures:
            await self.db.end(conn)
            return 0, 0
        return await self.db.settle(conn, report.acked, report.failures)

    async def publish(self, messages: Sequence[Claimed], wait_until: float) -> UnorderedReport:
        """Publish ``messages`` (each with the transport name its row names) at once and wait
        for their acknowledgements until ``wait_until`` (time.monotonic()); what became of
        each (a transport that cannot be used stops the pass: the rest stay unsent)."""
        report = UnorderedReport()
        in_flight: dict[asyncio.Future[None], UUID] = {}
        for message, transport_name in messages:
            try:
                transport = self.routing.transport(transport_name)
                acknowledgement = await transport.publish(message)
            except Exception as exc:  # PreparationError, SendError, a plug-in's bug...
                verdict = classify(exc)
                if verdict.fault is not Fault.ROW:  # the client is unusable: not these rows'
                    report.unavailable = redact(verdict.text)
                    break
                report.failures.append(_failure(message.id, verdict))
                continue
            future: asyncio.Future[None] = asyncio.ensure_future(acknowledgement)
            # Left behind when the deadline strikes or the worker stops (the row is sent
            # again): its outcome must still be retrieved, or asyncio reports each one.
            future.add_done_callback(_retrieve)
            in_flight[future] = message.id
        if not in_flight:
            return report
        done, late = await asyncio.wait(in_flight, timeout=max(wait_until - time.monotonic(), 0))
        report.unresolved = len(late)
        for future in done:
            message_id = in_flight[future]
            error = asyncio.CancelledError() if future.cancelled() else future.exception()
            if error is None:
                report.acked.append(message_id)
                continue
            verdict = classify(error)
            if verdict.fault is Fault.ROW:
                report.failures.append(_failure(message_id, verdict))
            else:  # its broker could not be used, or it was abandoned: no attempt counted
                report.unresolved += 1
                report.unavailable = report.unavailable or redact(verdict.text)
        return report

    def _log(self, report: UnorderedReport) -> None:
        if report.failures:
            self.log.warning(
                ("unordered_failed", shape(report.failures[0].error)),
                "store %s: %s unordered rows failed and are retried later; first error: %s",
                self.store.name,
                len(report.failures),
                report.failures[0].error,
                extra={
                    "action": "unordered_failed",
                    "store": self.store.name,
                    "rows": len(report.failures),
                    "error": report.failures[0].error,
                },
            )
        if report.unavailable:
            self.log.warning(
                ("unordered_unavailable", shape(report.unavailable)),
                "store %s: broker unreachable (%s); unordered rows are left for recovery",
                self.store.name,
                report.unavailable,
                extra={"action": "unordered_unavailable", "store": self.store.name},
            )


def _failure(message_id: UUID, verdict: Verdict) -> Failure:
    return Failure(message_id, verdict.text, verdict.permanent)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
