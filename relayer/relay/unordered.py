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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from uuid import UUID

from relayer.errors import StoreError, TransportError
from relayer.observability.throttle import ThrottledLog, shape
from relayer.redact import redact
from relayer.settings import StoreSettings
from relayer.store import Claimed, Connection, Failure, UnorderedStore, abandon
from relayer.transports.base import SendError, Transport

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
class _Report:
    acked: list[UUID] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    unresolved: int = 0
    unavailable: str = ""


class UnorderedSender:
    """Sends batches of one store's unordered rows through ``transports`` (started ones)."""

    def __init__(self, store: StoreSettings, transports: Mapping[str, Transport]) -> None:
        self.store = store
        self.transports = dict(transports)
        self.db = UnorderedStore(store)
        lease = store.lease_duration.total_seconds()
        self.deadline = lease / 2
        self.commit_reserve = lease / 8
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
                report = await self._publish(messages, wait_until)
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

    async def _settle(self, conn: Connection, report: _Report) -> tuple[int, int]:
        if not report.acked and not report.failures:
            await self.db.end(conn)
            return 0, 0
        return await self.db.settle(conn, report.acked, report.failures)

    async def _publish(self, messages: Sequence[Claimed], wait_until: float) -> _Report:
        report = _Report()
        in_flight: dict[asyncio.Future[None], UUID] = {}
        for message, transport_name in messages:
            transport = self._resolve(transport_name, message.id, report)
            if transport is None:
                continue
            try:
                acknowledgement = await transport.publish(message)
            except SendError as exc:
                report.failures.append(Failure(message.id, str(exc), not exc.retryable))
                continue
            except TransportError as exc:  # the client is unusable: not these rows' fault
                report.unavailable = redact(str(exc))
                break
            except Exception as exc:  # a plug-in's bug fails this row only
                report.failures.append(Failure(message.id, f"{type(exc).__name__}: {exc}"))
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
            error = future.exception() if not future.cancelled() else TransportError("cancelled")
            if error is None:
                report.acked.append(message_id)
            elif isinstance(error, SendError):
                report.failures.append(Failure(message_id, str(error), not error.retryable))
            elif isinstance(error, TransportError):
                report.unresolved += 1
                report.unavailable = report.unavailable or redact(str(error))
            else:
                report.failures.append(Failure(message_id, f"{type(error).__name__}: {error}"))
        return report

    def _resolve(self, name: str | None, message_id: UUID, report: _Report) -> Transport | None:
        name = name or self.store.default_transport
        transport = self.transports.get(name) if name is not None else None
        if transport is None:
            known = ", ".join(repr(known) for known in self.transports) or "none"
            report.failures.append(
                Failure(
                    message_id,
                    f"transport {name!r} is not configured for store {self.store.name!r} "
                    f"(configured: {known}); configure it (or default_transport) and the row is "
                    "retried",
                    permanent=True,
                )
            )
        return transport

    def _log(self, report: _Report) -> None:
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


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
