"""Sending one lane, rule by rule (docs/protocol.md).

A lane scan probes first (read-only, coalesced with every other scan that starts in the same
event-loop turn into one query), and only a lane whose head is due takes its lease:

1. lock the lane lease row and read the head rows in one round trip, in one transaction;
2. stop the read at a future-dated head; skip parked keys (the query does);
3. publish pipelined with per-key order (relayer.sending), admitting rows only during the first
   quarter of the lease and waiting for acknowledgements until shortly before half of it;
4. delete acknowledged rows and park failed keys in one fenced statement, check the counts;
5. commit. Any doubt about the database outcome rolls back: the rows stay and are resent.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any
from uuid import UUID, uuid4

import psycopg

from relayer.destinations import DestinationCache, PreparationError
from relayer.errors import FencedWriteError
from relayer.sending import send_batch
from relayer.settings import StoreSettings
from relayer.store import Failure, LaneHead, PendingRow, RelayStore
from relayer.transports.base import Transport

if TYPE_CHECKING:
    from relayer.tracing import RelayTracer

logger = logging.getLogger(__name__)


class Scan(Enum):
    """How a lane scan ended; it decides when the lane is scanned next."""

    SENT = "sent"  # made progress: scan again at once
    EMPTY = "empty"  # nothing to send: poll_interval
    FUTURE = "future"  # head is future-dated: at its due time (or poll_interval, earlier)
    BUSY = "busy"  # another live owner holds the lane: at its expiry (or poll_interval)
    UNAVAILABLE = "unavailable"  # the broker is unreachable: retry_backoff
    FAILED = "failed"  # database trouble: rolled back, retry_backoff


@dataclass(frozen=True, slots=True)
class ScanResult:
    lane: int
    scan: Scan
    next_in: float
    sent: int = 0
    failed: int = 0
    gave_up: int = 0
    cut_short: bool = False
    detail: str = ""
    acked: Sequence[UUID] = ()  # ids deleted by this batch, ascending (for latency metrics)


class Prober:
    """Coalesces the probes of every scan that starts in the same event-loop turn."""

    def __init__(self, store: RelayStore, connect: Callable[[], Any]) -> None:
        self._store = store
        self._connect = connect
        self._pending: dict[int, list[asyncio.Future[LaneHead]]] = {}
        self._flush_scheduled = False
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self.queries = 0

    async def head(self, lane: int) -> LaneHead:
        future: asyncio.Future[LaneHead] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(lane, []).append(future)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_flush)
        return await future

    def _start_flush(self) -> None:
        self._flush_scheduled = False
        waiting, self._pending = self._pending, {}
        task = asyncio.ensure_future(self._flush(waiting))
        task.add_done_callback(_log_unexpected)

    async def _flush(self, waiting: dict[int, list[asyncio.Future[LaneHead]]]) -> None:
        try:
            async with self._lock:
                if self._conn is None or self._conn.closed:
                    self._conn = await self._connect()
                self.queries += 1
                heads = await self._store.probe(self._conn, sorted(waiting))
        except BaseException as exc:
            if self._conn is not None and self._conn.broken:
                self._conn = None
            for futures in waiting.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(exc if isinstance(exc, Exception) else RuntimeError())
            if not isinstance(exc, Exception):
                raise
            return
        for head in heads:
            for future in waiting.pop(head.lane, []):
                if not future.done():
                    future.set_result(head)

    async def heads(self, lanes: Sequence[int]) -> list[LaneHead]:
        """The heads of ``lanes`` that hold rows (a member's whole share), in one query."""
        async with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await self._connect()
                self.queries += 1
                found = await self._store.probe(self._conn, lanes, busy_only=True)
            except BaseException:
                if self._conn is not None and self._conn.broken:
                    self._conn = None
                raise
        return found

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


def _log_unexpected(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "probe failed unexpectedly", exc_info=task.exception(), extra={"action": "probe_failed"}
        )


class LaneRelay:
    """Runs lane batches of one store for one member."""

    def __init__(
        self,
        store: StoreSettings,
        transports: Mapping[str, Transport],
        member: str,
        *,
        destinations: DestinationCache | None = None,
        clock: Callable[[], float] = time.monotonic,
        observer: Callable[[int, bool], None] | None = None,
        tracer: RelayTracer | None = None,
    ) -> None:
        self.store = store
        # Connections on which the fence check function exists (created once per connection).
        self._prepared: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()
        # Told (lane, True) once a lane's lock is taken and (lane, False) when its transaction
        # ended: the window in which this member may send the lane (tests and metrics use it).
        self.observer = observer
        self.db = RelayStore(store)
        # None unless OpenTelemetry is configured: then a span per batch and per sampled send.
        self.tracer = tracer
        self.transports = dict(transports) if tracer is None else tracer.wrap(transports)
        self.member = member
        self.destinations = destinations or DestinationCache()
        self.clock = clock
        lease = store.lease_duration.total_seconds()
        self.batch_deadline = lease / 2
        self.admission = lease / 4
        # Time kept back from the batch deadline for the outcome statement and the commit.
        self.commit_reserve = lease / 8
        self.poll = store.poll_interval.total_seconds()
        # After database or broker trouble (not a row's fault): retry soon, whatever the
        # parked keys' backoff is.
        self.backoff = min(store.retry_backoff.total_seconds(), lease / 3)

    def after_probe(self, head: LaneHead) -> ScanResult | None:
        """The result of a scan the probe already decided, or None if the lane must be sent."""
        if head.head_id is None:
            return ScanResult(head.lane, Scan.EMPTY, self.poll)
        if head.lease_live and head.owner not in (None, self.member):
            return ScanResult(head.lane, Scan.BUSY, min(max(head.lease_left, 0.01), self.poll))
        if head.future:
            return ScanResult(head.lane, Scan.FUTURE, min(max(head.due_in, 0.001), self.poll))
        return None

    def resolve(self, row: PendingRow) -> Transport:
        name = row.transport or self.store.default_transport
        if name is None:
            raise PreparationError(
                f"row {row.id} names no transport and store {self.store.name!r} has no "
                f"default_transport; set stores.{self.store.name}.default_transport, then "
                "redrive the key"
            )
        transport = self.transports.get(name)
        if transport is None:
            known = ", ".join(repr(known) for known in self.transports) or "none"
            raise PreparationError(
                f"transport {name!r} is not configured for store {self.store.name!r} "
                f"(configured: {known}); add [stores.{self.store.name}.transports.{name}] "
                "and restart the workers, or drop the key"
            )
        return transport

    async def send_lane(self, conn: psycopg.AsyncConnection[Any], lane: int) -> ScanResult:
        """One batch of ``lane`` on ``conn`` (not in autocommit mode). Never raises for database
        or broker trouble: the result says what happened and when to scan again."""
        if self.tracer is None:
            return await self._send_lane(conn, lane)
        with self.tracer.batch(self.store.name, lane) as span:
            result = await self._send_lane(conn, lane)
            span.finish(result)
            return result

    async def _send_lane(self, conn: psycopg.AsyncConnection[Any], lane: int) -> ScanResult:
        started = self.clock()
        try:
            if conn not in self._prepared:
                await self.db.prepare_connection(conn)
                self._prepared.add(conn)
            async with asyncio.timeout(self.batch_deadline):
                return await self._batch(conn, lane, started)
        except TimeoutError:
            await abandon(conn)
            return ScanResult(
                lane, Scan.FAILED, self.backoff, detail="batch deadline passed; rolled back"
            )
        except (psycopg.Error, FencedWriteError) as exc:
            await abandon(conn)
            logger.warning(
                "lane %s of store %s rolled back: %s",
                lane,
                self.store.name,
                exc,
                extra={"action": "rollback", "store": self.store.name, "lane": lane},
            )
            return ScanResult(lane, Scan.FAILED, self.backoff, detail=str(exc))

    async def _batch(
        self, conn: psycopg.AsyncConnection[Any], lane: int, started: float
    ) -> ScanResult:
        token, rows = await self.db.lock_and_read(
            conn, lane, self.member, uuid4(), self.store.batch_size
        )
        if token is None:
            await conn.rollback()
            return ScanResult(lane, Scan.BUSY, self.poll)
        if self.observer is not None:
            self.observer(lane, True)
        try:
            return await self._send_locked(conn, lane, started, token, rows)
        finally:
            if self.observer is not None:
                self.observer(lane, False)

    async def _send_locked(
        self,
        conn: psycopg.AsyncConnection[Any],
        lane: int,
        started: float,
        token: UUID,
        rows: list[PendingRow],
    ) -> ScanResult:
        if not rows:
            await conn.rollback()
            return ScanResult(lane, Scan.EMPTY, self.poll)
        read = len(rows)
        rows = _until_future(rows)
        if not rows:
            await conn.rollback()
            return ScanResult(lane, Scan.FUTURE, self.poll)
        report = await send_batch(
            rows,
            self.resolve,
            self.destinations,
            admit_until=started + self.admission,
            wait_until=started + self.batch_deadline - self.commit_reserve,
            clock=self.clock,
        )
        acked, failures = report.outcomes(rows)
        if not acked and not failures:
            await conn.rollback()
            if report.unavailable is not None:
                return ScanResult(lane, Scan.UNAVAILABLE, self.backoff, detail=report.unavailable)
            return ScanResult(lane, Scan.FAILED, self.backoff, detail="no acknowledgement in time")
        # Raises FencedWriteError (nothing committed) unless the lease held for every delete.
        outcomes = await self.db.record_outcomes(
            conn, lane=lane, member=self.member, token=token, acked=acked, failures=failures
        )
        self._log_failures(lane, rows, failures, outcomes.gave_up)
        # Scan again at once while rows may be left; a batch that read the lane to its end and
        # settled every row has left nothing: new rows come with a writer's NOTIFY (or the poll).
        failed_keys = {row.key for row in rows if row.id in {f.id for f in failures}}
        settled = len(acked) + sum(1 for row in rows if row.key in failed_keys)
        drained = read < self.store.batch_size and read == len(rows) and settled == read
        return ScanResult(
            lane,
            Scan.SENT,
            self.poll if drained and not report.cut_short else 0.0,
            sent=outcomes.deleted,
            failed=outcomes.failed,
            gave_up=outcomes.gave_up,
            acked=acked,
            cut_short=report.cut_short,
            detail=report.unavailable or "",
        )

    def _log_failures(
        self, lane: int, rows: Sequence[PendingRow], failures: Sequence[Failure], gave_up: int
    ) -> None:
        if not failures:
            return
        keys = {row.id: row.key for row in rows}
        for failure in failures:
            logger.warning(
                "key %r parked: %s",
                keys.get(failure.id),
                failure.error,
                extra={
                    "action": "park",
                    "store": self.store.name,
                    "lane": lane,
                    "key": keys.get(failure.id),
                    "error": failure.error,
                },
            )
        if gave_up:
            logger.error(
                "%s key(s) reached max_attempts=%s and wait for an operator "
                "(relayer parked redrive|drop %s)",
                gave_up,
                self.store.max_attempts,
                self.store.name,
                extra={"action": "give_up", "store": self.store.name, "lane": lane},
            )


def _until_future(rows: list[PendingRow]) -> list[PendingRow]:
    """The rows before the first future-dated one: a future head stalls its lane there."""
    for index, row in enumerate(rows):
        if row.future:
            return rows[:index]
    return rows


async def abandon(conn: psycopg.AsyncConnection[Any]) -> None:
    """Roll back after trouble; a connection in doubt is closed (the pool replaces it)."""
    try:
        if conn.broken or conn.closed:
            return
        async with asyncio.timeout(2):
            await conn.rollback()
    except (psycopg.Error, TimeoutError, OSError):
        await conn.close()
