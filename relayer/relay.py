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
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from uuid import UUID, uuid4

import psycopg

from relayer.destinations import DestinationCache, PreparationError
from relayer.errors import FencedWriteError
from relayer.sending import SendReport, State, send_batch
from relayer.settings import StoreSettings
from relayer.store import Failure, LaneHead, PendingRow, RelayStore
from relayer.transports.base import Transport

if TYPE_CHECKING:
    from relayer.tracing import RelayTracer

logger = logging.getLogger(__name__)

T = TypeVar("T")


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


class Coalescer(Generic[T]):
    """Serves together every lane asked for in the same event-loop turn.

    ``get(lane)`` waits for the lane's result; the lanes asked for in one turn are handed to
    ``serve`` at once (in chunks of at most ``chunk`` lanes, served concurrently, when ``chunk``
    is set), which returns a result per lane. A lane asked for twice in one turn is served
    once. Under load many scans start in the same turn, so the cost per lane falls as the load
    rises; alone, a lane is served at once.
    """

    def __init__(
        self, serve: Callable[[list[int]], Awaitable[Mapping[int, T]]], *, chunk: int = 0
    ) -> None:
        self._serve = serve
        self._chunk = chunk
        self._pending: dict[int, list[asyncio.Future[T]]] = {}
        self._scheduled = False
        self._tasks: set[asyncio.Future[None]] = set()

    async def get(self, lane: int) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._pending.setdefault(lane, []).append(future)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._start)
        return await future

    def _start(self) -> None:
        self._scheduled = False
        waiting, self._pending = self._pending, {}
        lanes = sorted(waiting)
        size = self._chunk or len(lanes) or 1
        for start in range(0, len(lanes), size):
            part = {lane: waiting[lane] for lane in lanes[start : start + size]}
            task = asyncio.ensure_future(self._run(part))
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        _log_unexpected(task)

    async def _run(self, waiting: dict[int, list[asyncio.Future[T]]]) -> None:
        try:
            results = await self._serve(list(waiting))
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else RuntimeError("cancelled")
            for futures in waiting.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(error)
            if not isinstance(exc, Exception):
                raise
            return
        for lane, futures in waiting.items():
            for future in futures:
                if future.done():
                    continue
                if lane in results:
                    future.set_result(results[lane])
                else:
                    future.set_exception(LookupError(f"no result for lane {lane}"))

    async def close(self) -> None:
        """Cancel what is still being served (shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task


class Prober:
    """Coalesces the probes of every scan that starts in the same event-loop turn into one
    query, on one connection."""

    def __init__(self, store: RelayStore, connect: Callable[[], Any]) -> None:
        self._store = store
        self._connect = connect
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._probes: Coalescer[LaneHead] = Coalescer(self._probe)
        self.queries = 0

    async def head(self, lane: int) -> LaneHead:
        return await self._probes.get(lane)

    async def _probe(self, lanes: list[int]) -> dict[int, LaneHead]:
        return {head.lane: head for head in await self._query(lanes, busy_only=False)}

    async def heads(self, lanes: Sequence[int]) -> list[LaneHead]:
        """The heads of ``lanes`` that hold rows (a member's whole share), in one query."""
        return await self._query(lanes, busy_only=True)

    async def _query(self, lanes: Sequence[int], *, busy_only: bool) -> list[LaneHead]:
        async with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await self._connect()
                self.queries += 1
                return await self._store.probe(self._conn, lanes, busy_only=busy_only)
            except BaseException:
                if self._conn is not None and self._conn.broken:
                    self._conn = None
                raise

    async def close(self) -> None:
        await self._probes.close()
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


def _log_unexpected(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "a coalesced lane probe or batch failed unexpectedly",
            exc_info=task.exception(),
            extra={"action": "probe_failed"},
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
        """One batch of ``lane`` on ``conn``; see ``send_lanes``."""
        return (await self.send_lanes(conn, [lane]))[0]

    async def send_lanes(
        self, conn: psycopg.AsyncConnection[Any], lanes: Sequence[int]
    ) -> list[ScanResult]:
        """One batch of ``lanes`` (distinct, sorted) in one transaction on ``conn`` (not in
        autocommit mode): a result per lane, in the same order. Never raises for database or
        broker trouble: each result says what happened and when to scan that lane again."""
        if self.tracer is None:
            return await self._send_lanes(conn, lanes)
        with self.tracer.batch(self.store.name, lanes) as span:
            results = await self._send_lanes(conn, lanes)
            span.finish(results)
            return results

    async def _send_lanes(
        self, conn: psycopg.AsyncConnection[Any], lanes: Sequence[int]
    ) -> list[ScanResult]:
        started = self.clock()
        try:
            if conn not in self._prepared:
                await self.db.prepare_connection(conn)
                self._prepared.add(conn)
            async with asyncio.timeout(self.batch_deadline):
                return await self._batch(conn, lanes, started)
        except TimeoutError:
            await abandon(conn)
            detail = "batch deadline passed; rolled back"
        except (psycopg.Error, FencedWriteError) as exc:
            await abandon(conn)
            detail = str(exc)
            logger.warning(
                "lane %s of store %s rolled back: %s",
                _lanes_text(lanes),
                self.store.name,
                exc,
                extra={"action": "rollback", "store": self.store.name, "lane": lanes[0]},
            )
        return [ScanResult(lane, Scan.FAILED, self.backoff, detail=detail) for lane in lanes]

    async def _batch(
        self, conn: psycopg.AsyncConnection[Any], lanes: Sequence[int], started: float
    ) -> list[ScanResult]:
        tokens, rows = await self.db.lock_and_read(
            conn, lanes, self.member, uuid4(), self.store.batch_size
        )
        if not tokens:
            await self.db.end_unchanged(conn)
            return [ScanResult(lane, Scan.BUSY, self.poll) for lane in lanes]
        if self.observer is not None:
            for lane in tokens:
                self.observer(lane, True)
        try:
            done = await self._send_locked(conn, started, tokens, rows)
        finally:
            if self.observer is not None:
                for lane in tokens:
                    self.observer(lane, False)
        return [done.get(lane) or ScanResult(lane, Scan.BUSY, self.poll) for lane in lanes]

    async def _send_locked(
        self,
        conn: psycopg.AsyncConnection[Any],
        started: float,
        tokens: Mapping[int, UUID],
        rows: list[PendingRow],
    ) -> dict[int, ScanResult]:
        """Send the rows of the locked lanes, record the outcomes and commit; each lane's
        result. Lanes with nothing to send are left out of the outcome statement's work but
        stay fenced with the others (their lease rows are locked all the same)."""
        read = _per_lane(rows)
        results: dict[int, ScanResult] = {}
        sendable: list[PendingRow] = []
        for lane in tokens:
            ready = _until_future(read.get(lane, []))
            if not ready:
                scan = Scan.FUTURE if read.get(lane) else Scan.EMPTY
                results[lane] = ScanResult(lane, scan, self.poll)
            sendable.extend(ready)
        if not sendable:
            await self.db.end_unchanged(conn)
            return results
        report = await send_batch(
            sendable,
            self.resolve,
            self.destinations,
            admit_until=started + self.admission,
            wait_until=started + self.batch_deadline - self.commit_reserve,
            clock=self.clock,
        )
        acked, failures = report.outcomes(sendable)
        gave_up: Sequence[int] = ()
        if acked or failures:
            # Raises FencedWriteError (nothing committed) unless every lease held for every
            # delete.
            outcomes = await self.db.record_outcomes(
                conn, member=self.member, tokens=tokens, acked=acked, failures=failures
            )
            gave_up = outcomes.gave_up
            self._log_failures(failures, gave_up)
        else:
            await self.db.end_unchanged(conn)
        acked_by_lane = _per_lane(acked)
        failed_by_lane = _per_lane([row for row, _ in failures])
        positions: dict[int, list[int]] = {}
        for index, row in enumerate(sendable):
            positions.setdefault(row.lane, []).append(index)
        for lane, indexes in positions.items():
            results[lane] = self._lane_result(
                lane,
                indexes,
                sendable=sendable,
                report=report,
                acked=acked_by_lane.get(lane, []),
                failed=failed_by_lane.get(lane, []),
                read_count=len(read[lane]),
                gave_up=gave_up.count(lane),
            )
        return results

    def _lane_result(
        self,
        lane: int,
        indexes: Sequence[int],
        *,
        sendable: Sequence[PendingRow],
        report: SendReport,
        acked: Sequence[PendingRow],
        failed: Sequence[PendingRow],
        read_count: int,
        gave_up: int,
    ) -> ScanResult:
        """How one lane of a batch ended, from its own rows only (the other lanes of the batch
        may have been luckier or less lucky)."""
        down = next((report.down[index] for index in indexes if index in report.down), "")
        failed_keys = {row.key for row in failed}
        # Rows the batch never got to: admission ended (or a publish blocked) before them.
        not_admitted = any(
            report.states[index] is State.UNSENT
            and index not in report.down
            and sendable[index].key not in failed_keys
            for index in indexes
        )
        if not acked and not failed:
            if down:
                # Its broker cannot be reached: not the rows' fault, wait as if alone.
                return ScanResult(lane, Scan.UNAVAILABLE, self.backoff, detail=down)
            if any(report.states[index] is State.IN_FLIGHT for index in indexes):
                return ScanResult(
                    lane, Scan.FAILED, self.backoff, detail="no acknowledgement in time"
                )
            # Nothing of it was published: other lanes of the batch used up the admission
            # window. Its turn comes at once.
            return ScanResult(lane, Scan.SENT, 0.0, cut_short=True)
        # Scan again at once while rows may be left; a batch that read the lane to its end and
        # settled every row has left nothing: new rows come with a writer's NOTIFY (or the
        # poll).
        settled = len(acked) + sum(1 for index in indexes if sendable[index].key in failed_keys)
        drained = (
            read_count < self.store.batch_size
            and read_count == len(indexes)
            and settled == read_count
        )
        return ScanResult(
            lane,
            Scan.SENT,
            self.poll if drained and not not_admitted else 0.0,
            sent=len(acked),
            failed=len(failed),
            gave_up=gave_up,
            acked=tuple(row.id for row in acked),
            cut_short=not_admitted,
            detail=down,
        )

    def _log_failures(
        self, failures: Sequence[tuple[PendingRow, Failure]], gave_up: Sequence[int]
    ) -> None:
        for row, failure in failures:
            logger.warning(
                "key %r parked: %s",
                row.key,
                failure.error,
                extra={
                    "action": "park",
                    "store": self.store.name,
                    "lane": row.lane,
                    "key": row.key,
                    "error": failure.error,
                },
            )
        for lane in sorted(set(gave_up)):
            logger.error(
                "%s key(s) reached max_attempts=%s and wait for an operator "
                "(relayer parked redrive|drop %s)",
                gave_up.count(lane),
                self.store.max_attempts,
                self.store.name,
                extra={"action": "give_up", "store": self.store.name, "lane": lane},
            )


def _per_lane(rows: Sequence[PendingRow]) -> dict[int, list[PendingRow]]:
    """``rows`` grouped by lane, each lane's rows in their given order."""
    grouped: dict[int, list[PendingRow]] = {}
    for row in rows:
        grouped.setdefault(row.lane, []).append(row)
    return grouped


def _lanes_text(lanes: Sequence[int]) -> str:
    return ", ".join(str(lane) for lane in lanes)


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
