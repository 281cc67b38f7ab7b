"""The lane batch, rule by rule (docs/protocol.md): one transaction over one or more lanes.

1. lock the lanes' lease rows and read their head rows in one round trip;
2. stop each lane's read at a future-dated head; skip parked keys (the query does);
3. publish pipelined with per-key order (relayer.relay.pipeline), admitting rows only during
   the first quarter of the lease and waiting for acknowledgements until shortly before half
   of it;
4. delete acknowledged rows and park failed keys in one fenced statement, sent with the COMMIT;
5. any doubt about the database outcome rolls back: the rows stay and are resent.
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from uuid import uuid4

from relayer.deadlines import Deadlines
from relayer.errors import FencedWriteError, StoreError
from relayer.observability.throttle import ThrottledLog, shape
from relayer.relay.pipeline import IN_FLIGHT, UNSENT, BatchSender, SendReport
from relayer.relay.results import Scan, ScanResult
from relayer.relay.trace import BatchTrace, RelayTracer
from relayer.settings import StoreSettings
from relayer.store import Connection, LaneRows, RelayStore, RowFailure
from relayer.transports.routing import Routing

logger = logging.getLogger(__name__)

# Lanes that share one batch transaction reading a whole batch_size each (scans due in the same
# event-loop turn); a batch may take up to WIDE_BATCH_LANES lanes when more are waiting, each
# read with a smaller limit (LaneRelay.lane_limit): under a backlog spread over many lanes with
# a few rows each, the cost of a transaction is then shared by far more rows.
BATCH_LANES = 16
WIDE_BATCH_LANES = 512
# A backlog spread over many lanes starts a batch for every SPREAD_LANES scans due together
# (relayer.worker), as many as the due lanes fill at SPREAD_BATCH_LANES each: batches side by
# side overlap their round trips and acknowledgements, and each still takes up to
# WIDE_BATCH_LANES lanes (at most half of those due).
SPREAD_BATCH_LANES = 128


class LaneRelay:
    """Runs lane batches of one store for one member."""

    def __init__(
        self,
        store: StoreSettings,
        routing: Routing,
        member: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        observer: Callable[[int, bool], None] | None = None,
        tracer: RelayTracer | None = None,
    ) -> None:
        self.store = store
        # Told (lane, True) once a lane's lock is taken and (lane, False) when its transaction
        # ended: the window in which this member may send the lane (tests and metrics use it).
        self.observer = observer
        self.db = RelayStore(store)
        # None unless OpenTelemetry is configured: then a span per batch and per sampled send.
        self.tracer = tracer
        self.routing = routing
        self.member = member
        self.clock = clock
        self.deadlines = deadlines = Deadlines.of(store.lease_duration)
        self.poll = store.poll_interval.total_seconds()
        # After database or broker trouble (not a row's fault): retry soon, whatever the
        # parked keys' backoff is.
        self.backoff = min(store.retry_backoff.total_seconds(), deadlines.longest_retry)
        # While the database or a broker is down every lane fails alike: one line per cause.
        self.log = ThrottledLog(logger)
        # Set by stop(): no batch starts, and the batches sending now admit no new row.
        self.stopped = False
        self._senders: set[BatchSender] = set()

    def stop(self) -> None:
        """The worker is stopping: batches in flight admit no new row (they wait for what they
        sent until their deadline and commit the confirmed prefix); no new batch starts."""
        self.stopped = True
        for sender in self._senders:
            sender.stop_admitting()

    async def send_lanes(self, conn: Connection, lanes: Sequence[int]) -> list[ScanResult]:
        """One batch of ``lanes`` (distinct, sorted) in one transaction on ``conn`` (not in
        autocommit mode): a result per lane, in the same order. Never raises for database or
        broker trouble: each result says what happened and when to scan that lane again."""
        if self.tracer is None:
            return await self._send_lanes(conn, lanes, None)
        with self.tracer.batch(self.store.name, lanes, self.routing) as trace:
            results = await self._send_lanes(conn, lanes, trace)
            trace.finish(results)
            return results

    async def _send_lanes(
        self, conn: Connection, lanes: Sequence[int], trace: BatchTrace | None
    ) -> list[ScanResult]:
        if self.stopped:
            return [ScanResult(lane, Scan.STOPPED, 0.0) for lane in lanes]
        started = self.clock()
        try:
            async with asyncio.timeout(self.deadlines.batch):
                return await self._batch(conn, lanes, started, trace)
        except TimeoutError as exc:
            await self.db.abandon(conn)
            detail = "batch deadline passed; rolled back"
            if trace is not None:
                trace.rolled_back(exc)
        except (StoreError, FencedWriteError) as exc:
            await self.db.abandon(conn)
            detail = str(exc)
            if trace is not None:
                trace.rolled_back(exc)
            self.log.warning(
                ("rollback", shape(detail)),
                "lane %s of store %s rolled back: %s; its rows stay in the outbox and are sent "
                "again",
                ", ".join(str(lane) for lane in lanes),
                self.store.name,
                detail,
                extra={"action": "rollback", "store": self.store.name, "lane": lanes[0]},
            )
        return [ScanResult(lane, Scan.FAILED, self.backoff, detail=detail) for lane in lanes]

    def lane_limit(self, lane_count: int) -> int:
        """Rows read per lane when a batch serves ``lane_count`` lanes: ``batch_size`` for up
        to BATCH_LANES lanes, fewer for more, so that one transaction reads at most
        BATCH_LANES x ``batch_size`` rows (a wide batch is for many lanes with a few rows each;
        a lane with more is read again at once)."""
        batch_size = self.store.batch_size
        if lane_count <= BATCH_LANES:
            return batch_size
        return max(1, -(-BATCH_LANES * batch_size // lane_count))

    async def _batch(
        self, conn: Connection, lanes: Sequence[int], started: float, trace: BatchTrace | None
    ) -> list[ScanResult]:
        limit = self.lane_limit(len(lanes))
        tokens, rows = await self.db.lock_and_read(conn, lanes, self.member, uuid4(), limit)
        if not tokens:
            await self.db.end_unchanged(conn)
            return [ScanResult(lane, Scan.BUSY, self.poll) for lane in lanes]
        if self.observer is not None:
            for lane in tokens:
                self.observer(lane, True)
        try:
            done = await self._send_locked(conn, started, tokens, rows, limit, trace=trace)
        finally:
            if self.observer is not None:
                for lane in tokens:
                    self.observer(lane, False)
        return [done.get(lane) or ScanResult(lane, Scan.BUSY, self.poll) for lane in lanes]

    async def _send_locked(
        self,
        conn: Connection,
        started: float,
        tokens: Mapping[int, str],
        rows: LaneRows,
        limit: int,
        *,
        trace: BatchTrace | None,
    ) -> dict[int, ScanResult]:
        """Send the rows of the locked lanes, record the outcomes and commit; each lane's
        result. Lanes with nothing to send are left out of the outcome statement's work but
        stay fenced with the others (their lease rows are locked all the same)."""
        results, sendable, ready_spans = self._ready(rows, tokens)
        if not sendable:
            await self.db.end_unchanged(conn)
            return results
        report = await self._publish(rows, sendable, started, trace)
        acked, failed = report.outcomes(rows, sendable)
        gave_up = await self._record(
            conn, tokens, rows, report, acked=acked, failed=failed, trace=trace
        )
        all_acked = len(acked) == len(sendable)
        for lane, span in ready_spans.items():
            if all_acked:
                results[lane] = self._all_acked(rows, lane, span, limit)
            else:
                results[lane] = self._lane_result(
                    rows,
                    lane,
                    span,
                    report,
                    limit=limit,
                    acked=acked,
                    failed=failed,
                    gave_up=gave_up,
                )
        return results

    def _ready(
        self, rows: LaneRows, tokens: Mapping[int, str]
    ) -> tuple[dict[int, ScanResult], Sequence[int], dict[int, tuple[int, int, int]]]:
        """Which rows of the locked lanes may be sent now (each lane's rows up to its first
        future-dated one), each lane's span of them (lane -> (start, ready end, end)), and the
        results of the lanes that have none (empty, or a future head)."""
        spans = _lane_spans(rows)
        results: dict[int, ScanResult] = {}
        future = rows.future
        any_future = any(future)
        sendable: list[int] | range = range(len(rows)) if not any_future else []
        ready_spans: dict[int, tuple[int, int, int]] = {}
        for lane in tokens:
            start, end = spans.get(lane, (0, 0))
            ready_end = end
            if any_future:
                for index in range(start, end):
                    if future[index]:
                        ready_end = index
                        break
                assert isinstance(sendable, list)
                sendable.extend(range(start, ready_end))
            if ready_end == start:
                scan = Scan.FUTURE if end > start else Scan.EMPTY
                results[lane] = ScanResult(lane, scan, self.poll)
            else:
                ready_spans[lane] = (start, ready_end, end)
        return results, sendable, ready_spans

    async def _publish(
        self, rows: LaneRows, sendable: Sequence[int], started: float, trace: BatchTrace | None
    ) -> SendReport:
        """Hand the ``sendable`` rows to their transports (relayer.relay.pipeline) within the
        batch's admission and acknowledgement deadlines."""
        deadlines = self.deadlines
        sender = BatchSender(
            rows,
            sendable,
            self.routing,
            admit_until=started + deadlines.admission,
            wait_until=started + deadlines.batch - deadlines.commit_reserve,
            clock=self.clock,
            report=None if trace is None else trace.sending(rows, sendable),
        )
        if self.stopped:
            sender.stop_admitting()
        self._senders.add(sender)
        try:
            return await sender.run()
        finally:
            self._senders.discard(sender)

    async def _record(
        self,
        conn: Connection,
        tokens: Mapping[int, str],
        rows: LaneRows,
        report: SendReport,
        *,
        acked: Sequence[int],
        failed: Sequence[int],
        trace: BatchTrace | None,
    ) -> Sequence[int]:
        """Delete the ``acked`` rows and park the keys of the ``failed`` ones in one fenced
        statement sent with the COMMIT (or just end the transaction when there is neither);
        the lane of each key that reached max_attempts. Raises FencedWriteError (nothing
        committed) unless every lease held for every delete."""
        failures = [report.failure(rows, index) for index in failed]
        if not acked and not failures:
            await self.db.end_unchanged(conn)
            return ()
        ids = rows.batch.ids
        lanes = rows.lanes
        everything = len(acked) == len(rows)
        outcomes = await self.db.record_outcomes(
            conn,
            member=self.member,
            tokens=tokens,
            acked=ids if everything else [ids[index] for index in acked],
            acked_lanes=lanes if everything else [lanes[index] for index in acked],
            failures=failures,
        )
        if trace is not None:
            trace.recorded(acked, failed, len(outcomes.gave_up))
        self._log_failures(rows, failures, outcomes.gave_up)
        return outcomes.gave_up

    def _all_acked(
        self, rows: LaneRows, lane: int, span: tuple[int, int, int], limit: int
    ) -> ScanResult:
        """A lane whose every sendable row was acknowledged (``limit``: rows read per lane)."""
        start, ready_end, end = span
        read_count = end - start
        drained = read_count < limit and ready_end == end
        return ScanResult(
            lane,
            Scan.SENT,
            self.poll if drained else 0.0,
            sent=ready_end - start,
            acked=rows.batch.ids[start:ready_end],
        )

    def _lane_result(
        self,
        rows: LaneRows,
        lane: int,
        span: tuple[int, int, int],
        report: SendReport,
        *,
        limit: int,
        acked: Sequence[int],
        failed: Sequence[int],
        gave_up: Sequence[int],
    ) -> ScanResult:
        """How one lane of a batch ended, from its own rows only (the other lanes of the batch
        may have been luckier or less lucky)."""
        start, ready_end, end = span
        states = report.states
        keys = rows.batch.keys
        lane_acked = [index for index in acked if start <= index < ready_end]
        lane_failed = [index for index in failed if start <= index < ready_end]
        indexes = range(start, ready_end)
        down = next((report.down[index] for index in indexes if index in report.down), "")
        failed_keys = {keys[index] for index in lane_failed}
        # Rows the batch never got to: admission ended (or a publish blocked) before them.
        not_admitted = any(
            states[index] == UNSENT
            and index not in report.down
            and index not in report.failures
            and keys[index] not in failed_keys
            for index in indexes
        )
        if not lane_acked and not lane_failed:
            if down:
                # Its broker cannot be reached: not the rows' fault, wait as if alone.
                return ScanResult(lane, Scan.UNAVAILABLE, self.backoff, detail=down)
            if any(states[index] == IN_FLIGHT for index in indexes):
                # Sent, but the broker acknowledged none of it within the batch deadline: a
                # stalled or slow broker, not the rows' fault (they stay, no attempt counted).
                return ScanResult(lane, Scan.UNAVAILABLE, self.backoff, detail=_NO_ACK)
            # Nothing of it was published: other lanes of the batch used up the admission
            # window. Its turn comes at once.
            return ScanResult(lane, Scan.SENT, 0.0, cut_short=True)
        # Scan again at once while rows may be left; a batch that read the lane to its end and
        # settled every row has left nothing: new rows come with a writer's NOTIFY (or the
        # poll).
        settled = len(lane_acked) + sum(1 for index in indexes if keys[index] in failed_keys)
        read_count = end - start
        drained = read_count < limit and read_count == ready_end - start and settled == read_count
        ids = rows.batch.ids
        return ScanResult(
            lane,
            Scan.SENT,
            self.poll if drained and not not_admitted else 0.0,
            sent=len(lane_acked),
            failed=len(lane_failed),
            gave_up=gave_up.count(lane),
            acked=tuple(ids[index] for index in lane_acked),
            cut_short=not_admitted,
            detail=down,
        )

    def _log_failures(
        self, rows: LaneRows, failures: Sequence[RowFailure], gave_up: Sequence[int]
    ) -> None:
        keys = rows.batch.keys
        ids = rows.batch.ids
        key_of = {ids[index]: keys[index] for index in range(len(rows))} if failures else {}
        for failure in failures:
            key = key_of.get(failure.id)
            self.log.warning(
                ("park", shape(failure.error)),
                "key %r parked: %s",
                key,
                failure.error,
                extra={
                    "action": "park",
                    "store": self.store.name,
                    "lane": failure.lane,
                    "key": key,
                    "error": failure.error,
                },
            )
        for lane in sorted(set(gave_up)):
            self.log.error(
                ("give_up",),
                "%s key(s) reached max_attempts=%s and wait for an operator "
                "(relayer parked redrive|drop %s)",
                gave_up.count(lane),
                self.store.max_attempts,
                self.store.name,
                extra={"action": "give_up", "store": self.store.name, "lane": lane},
            )


_NO_ACK = (
    "the broker acknowledged nothing of this lane's batch within the batch deadline "
    "(lease_duration / 2); the rows stay and are sent again"
)


def _lane_spans(rows: LaneRows) -> dict[int, tuple[int, int]]:
    """Each lane's rows as a range of indexes (rows are in (lane, id) order)."""
    spans: dict[int, tuple[int, int]] = {}
    lanes = rows.lanes
    count = len(lanes)
    start = 0
    while start < count:
        lane = lanes[start]
        end = bisect_right(lanes, lane, start)
        spans[lane] = (start, end)
        start = end
    return spans
