"""The programmatic worker: everything ``relayer run`` does, usable inside an asyncio app.

One Worker serves one or more stores. Each store is a dispatch queue whose jobs are lane scans
keyed by lane number; one worker group (Weighted or Strict over the stores) runs the scans in a
pool of slots. Scans that become due in the same event-loop turn send their lanes together, in
one batch transaction of up to BATCH_LANES lanes on a pooled database connection, which takes
more due lanes of the store's queue (up to WIDE_BATCH_LANES) when they wait. The stores of one
database share the worker's connections to it (relayer.store.databases): a housekeeping
connection (heartbeats, probes), a LISTEN connection that turns writers' notifications into
immediate scans (the poll interval is the fallback, and the only wake-up behind a transaction
pooler without ``listen_dsn``: relayer.pooler), a dispatcher connection and a pool of batch
connections; every database's draw on one budget, ``worker.max_connections``.

    worker = Worker([store_settings], transports={"orders": {"kafka": transport}})
    await worker.run(stop_event)   # until stop_event is set; then finishes batches and leaves

Stores join and leave a running worker with ``add_store`` and ``remove_store`` (a template's
discovery does: relayer.fleet). A store's StoreRuntime takes every resource it needs in
``open()`` and gives each back in ``close()``; the worker only wires runtimes into its group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from relayer.destinations import DestinationCache
from relayer.dispatch import (
    Job,
    MemoryQueue,
    PostgresClusterState,
    RoutedClusterState,
    Strict,
    Weighted,
    WorkerGroup,
)
from relayer.dispatch.clock import MonotonicClock
from relayer.dispatch.cluster import ClusterState
from relayer.dispatch.dispatcher import DispatcherConnection
from relayer.errors import ConfigurationError, ConnectionsBusy, StoreError, UsageError
from relayer.observability.metrics import (
    Histogram,
    batch_duration_histogram,
    write_to_ack_histogram,
)
from relayer.observability.throttle import ThrottledLog, shape
from relayer.relay import (
    BATCH_LANES,
    SPREAD_BATCH_LANES,
    WIDE_BATCH_LANES,
    Coalescer,
    LaneRelay,
    Prober,
    Scan,
    ScanResult,
    WakeWindow,
)
from relayer.relay.membership import Membership, new_instance_id
from relayer.settings import StoreSettings, WorkerSettings
from relayer.store import LaneHead, RelayStore
from relayer.store.databases import (
    ConnectionPlan,
    Database,
    DatabaseKey,
    Databases,
    plan_connections,
)
from relayer.store.housekeeping import next_tick
from relayer.tracing import RelayTracer, relay_tracer
from relayer.transports.base import Transport
from relayer.transports.lifecycle import SharedTransports
from relayer.worker.maintenance import Maintenance, cleanup_lane, maintenance_queue

logger = logging.getLogger(__name__)

# Under a backlog over more lanes than a batch takes, the scans due together start a batch per
# this many of them, each taking waiting lanes (StoreRuntime._spread): 20 slots keep about five
# batches in flight. More batches at once overlapped no more work on 2 cores and cost each
# PostgreSQL backend more (connections that had not run the statements yet, contention).
SPREAD_LANES = 4
# A wake-up probe of a share over more lanes than twice this looks at the first this many
# lanes first and at the rest in a second query, so that batches start after a fraction of the
# probe (over 65,536 lanes with a backlog in 9,000 of them, the whole probe takes 60-130 ms).
FIRST_PROBE_LANES = 8192
# How long a scan waits for a batch connection when the worker's budget has none free before
# it gives its slot back (Scan.WAITING, scanned again at once; nothing is counted).
CONNECTION_WAIT = 0.25
# The longest wait of an idle store's fallback poll while LISTEN wakes it (seconds; at most a
# third of the lease): see StoreRuntime.idle_poll_wait.
IDLE_POLL_MAX = 10.0
# A stopping worker closes its transports within what is left of its stop budget
# (lease_duration / 2, by which every batch in flight has ended), but gives them at least this
# long (seconds): see Worker.run.
CLOSE_FLOOR = 0.1


@dataclass(slots=True)
class StoreStats:
    """Counters of one store in this worker (read by status displays and metrics)."""

    sent: int = 0
    failed: int = 0
    gave_up: int = 0
    batches: int = 0
    rollbacks: int = 0
    scans: int = 0
    by_scan: dict[str, int] = field(default_factory=dict)
    last_error: str = ""
    # Updated once per batch, exported by relayer.observability.metrics when Prometheus scrapes.
    batch_seconds: Histogram = field(default_factory=batch_duration_histogram)
    write_to_ack_seconds: Histogram = field(default_factory=write_to_ack_histogram)

    def record(self, result: ScanResult) -> None:
        """Count one lane scan (its acknowledged rows' ages: ``observe_acked``, per batch)."""
        self.scans += 1
        name = result.scan.value  # an enum's value is a descriptor call: asked once
        self.by_scan[name] = self.by_scan.get(name, 0) + 1
        if result.scan is Scan.SENT:
            self.batches += 1
            self.sent += result.sent
            self.failed += result.failed
            self.gave_up += result.gave_up
        elif result.scan in (Scan.FAILED, Scan.UNAVAILABLE):
            self.rollbacks += 1
            self.last_error = result.detail

    def observe_acked(self, results: Iterable[ScanResult], *, now_ms: int | None = None) -> None:
        """Record the write-to-ack age (at ``now_ms``, default now) of every row a batch
        transaction's lanes had acknowledged, in one pass over the batch (each lane's ids
        ascend: sorting their concatenation merges runs), not one per lane."""
        acked = [message_id for result in results for message_id in result.acked]
        if acked:
            acked.sort()
            if now_ms is None:
                now_ms = time.time_ns() // 1_000_000
            self.write_to_ack_seconds.observe_ages(acked, now_ms)


class StoreRuntime:
    """One store served by this worker: its membership, lanes queue, connections and relay."""

    def __init__(
        self,
        store: StoreSettings,
        transports: Mapping[str, Transport],
        member: str,
        database: Database,
        now: Callable[[], float],
        *,
        tracer: RelayTracer | None = None,
        gate: PostgresClusterState | None = None,
        shared: SharedTransports | None = None,
    ) -> None:
        self.store = store
        self.member = member
        self.transports = dict(transports)
        self.now = now
        # Its queues' pause state and concurrency limits (None: the worker's cluster_state).
        self.gate = gate
        self.shared = shared or SharedTransports()
        # Set when the worker stops or the store leaves it: ends heartbeats, LISTEN and polls.
        self.halt = asyncio.Event()
        self.opened = False
        self._gate_open = False
        self._transports_held = False
        self._joined = False
        self._attached = False
        self._closing: asyncio.Future[None] | None = None
        self.queue: MemoryQueue[int] = MemoryQueue(store.name)
        self.relay = LaneRelay(
            store, self.transports, member, destinations=DestinationCache(), tracer=tracer
        )
        # The connections of the store's database, shared with its other stores in this worker.
        self.database = database
        self.housekeeping = database.housekeeping.for_store(store)
        self.membership = Membership(
            store,
            member,
            session=self.housekeeping,
            batched=database.batched,
            on_change=self._lanes_changed,
        )
        self.statements = RelayStore(store)
        self.prober = Prober(self.statements, session=self.housekeeping)
        self.pool = database.pool.for_store(store)
        # Unordered recovery and retention, in a queue of their own (relayer.worker.maintenance).
        leading = cleanup_lane(store)
        self.maintenance = Maintenance(
            store,
            self.transports,
            self.pool,
            now,
            leader=lambda: leading in self.membership.lanes,
            session=self.housekeeping,
        )
        self.stats = StoreStats()
        # A database or broker that is down fails every lane alike: one line per cause.
        self.log = ThrottledLog(logger)
        self._waking: asyncio.Future[None] | None = None
        self._releasing: asyncio.Future[None] | None = None
        self._wake_again = False
        self._wake_fully = False  # a wake-up other than the fallback poll is waiting
        # Batches of _send_group still waiting for their connection (_spread counts them).
        self._connecting = 0
        # Lanes that writers' notifications wake within one wake_linger share a batch.
        self.window = WakeWindow(store.wake_linger.total_seconds())
        # Consecutive polls that found no row: while LISTEN wakes the store, an idle store's
        # fallback poll waits twice as long after each (idle_poll_wait).
        self._idle_polls = 0
        # Lanes known to have a due head (a probe saw it, a writer's notification named the
        # lane, or a batch left rows) whose scan is waiting: it skips its own probe, a batch of
        # other lanes may take the lane (_widen), and wake-up probes leave it out. Only this
        # member sends its lanes, so a head seen due stays due until the lane's next scan.
        self._due: set[int] = set()
        # Lanes whose last scan met a broker or database that could not be used: no wake-up
        # (a writer's NOTIFY, a probe) scans them before their retry_backoff is over, so an
        # outage costs one attempt per lane per backoff however fast rows are written.
        self._held: dict[int, float] = {}
        # Scans due in the same event-loop turn send their lanes in shared transactions.
        self._batches: Coalescer[ScanResult] = Coalescer(self._send_group, chunk=BATCH_LANES)

    def _lanes_changed(self, lanes: frozenset[int]) -> None:
        self._idle_polls = 0
        self.window.keep(lanes)
        self.maintenance.lanes_changed()  # the cleanup runs where its lane is
        for lane in range(self.store.lanes):
            if lane not in lanes:
                self.queue.discard(lane)
                self._due.discard(lane)
                self._held.pop(lane, None)
        self.wake_all()  # probe the new share: lanes with due heads get scanned

    def woken(self, payload: str) -> None:
        """A writer's NOTIFY: the payload is a lane to scan now, or empty for every lane."""
        try:
            lane = int(payload)
        except ValueError:
            self.wake_all()
            return
        self._idle_polls = 0
        if lane in self.membership.lanes:
            # Skip the probe: a row was just committed in this lane.
            self._due.add(lane)
            self._schedule(lane, self.window.wake(lane, self.now(), lead=self._free))

    def _notified(self, payload: str) -> None:
        self.woken(payload)  # looked up on each notification: tests wrap it on a running worker

    def _free(self, lane: int) -> bool:
        """Nothing waits for ``lane``: no scan of it is waiting or running, no outage holds it
        (a lane woken now may then lead a wake_linger window: WakeWindow)."""
        return lane not in self._held and not self.queue.holds(lane)

    def wake_all(self, *, fallback: bool = False) -> None:
        """Probe every owned lane in one query and scan the lanes whose head is due, now (on an
        empty NOTIFY, after a reconnect or a new share; ``fallback``: the poll every
        poll_interval). Idle lanes cost no job and no write, and lanes whose head is known to
        be due (their scan waits) are left out of the probe. The fallback poll is for
        notifications that were lost, so it also leaves out every lane whose scan is waiting
        or running (that scan probes the lane or reschedules it). Wake-ups that arrive during
        a probe fold into one more."""
        if not fallback:
            self._wake_fully = True
        if self._waking is not None and not self._waking.done():
            self._wake_again = True
            return
        self._waking = asyncio.ensure_future(self._wake())

    async def _wake(self) -> None:
        self._wake_again = True
        while self._wake_again:
            self._wake_again = False
            fully, self._wake_fully = self._wake_fully, False
            membership = self.membership
            if not membership.lanes:
                return
            skip = frozenset(self._due) if fully else self.queue.keys()
            found = False
            try:
                if self._idle_polls and not await self.database.batched.holds_rows(self.statements):
                    # Idle, and still no row in any lane: asked together with the database's
                    # other idle stores, one column each, instead of a probe of its own.
                    parts = []
                else:
                    parts = probe_parts(self.store.lanes)
                for part in parts:
                    heads = await self.prober.heads(
                        membership.rank, len(membership.members), skip=skip, lanes=part
                    )
                    found = found or bool(heads)
                    self._woken(heads)  # the first part's scans start while the rest is probed
            except StoreError as exc:
                self.stats.last_error = str(exc)
                return  # the next poll tries again
            # A poll that found no lane to wake (every lane with rows has its scan waiting or
            # running, or there is none) makes the fallback poll wait longer (idle_poll_wait).
            self._idle_polls = 0 if found else self._idle_polls + 1

    def _woken(self, heads: list[LaneHead]) -> None:
        """Schedule the scans of the lanes a wake-up probe found."""
        now = self.now()
        # Lanes found due while a wake_linger window is open join it: they go in the batch
        # of the lanes notified within it (a poll that fell inside the window would otherwise
        # start batches of its own a few milliseconds earlier).
        window = self.window
        joining = window.is_open(now)
        for head in heads:
            decided = self.relay.after_probe(head)
            if decided is None:
                self._due.add(head.lane)
                self._schedule(head.lane, window.join(head.lane) if joining else now)
            elif decided.scan in (Scan.FUTURE, Scan.BUSY):
                self._schedule(head.lane, now + decided.next_in)

    def _schedule(self, lane: int, due: float) -> None:
        """Scan ``lane`` at ``due``, or once its hold after an outage is over if later."""
        held = self._held.get(lane)
        if held is not None:
            if held > due:
                due = held
            else:
                del self._held[lane]
        self.queue.schedule(lane, due)

    def idle_poll_wait(self) -> float:
        """How long the fallback poll waits now: poll_interval, doubled after each poll in a
        row that found no lane to wake (no row, or rows only in lanes whose scan is waiting or
        running already), up to IDLE_POLL_MAX (at most lease_duration / 3), while a
        LISTEN connection wakes the store (a writer's notification, a lane change or a
        reconnect sets it back). Without LISTEN the poll is the only wake-up: no doubling."""
        poll = self.relay.poll
        if self.database.listener is None or not self._idle_polls:
            return poll
        most = max(poll, min(IDLE_POLL_MAX, self.store.lease_duration.total_seconds() / 3))
        return min(poll * (1 << min(self._idle_polls, 16)), most)

    async def poll(self, stop: asyncio.Event) -> None:
        """The fallback for lost notifications: probe every owned lane each poll_interval (less
        often while the store is idle: idle_poll_wait). Each wait ends at the next multiple of
        its length, so that the polls of the database's idle stores come due together (their
        probes then go in one statement: relayer.store.housekeeping). A poll while every owned
        lane has a scan waiting or running probes nothing: each of them is scanned anyway
        (under a backlog the probe of a whole share cost more than a batch)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), next_tick(self.idle_poll_wait(), self.now()))
            if not stop.is_set() and not self.every_lane_queued():
                self.wake_all(fallback=True)
            for log in self._logs():
                log.flush_due()

    def every_lane_queued(self) -> bool:
        """Every lane this member owns has a scan waiting or running in the store's queue."""
        queue = self.queue
        lanes = self.membership.lanes
        if not lanes or len(queue) + queue.running < len(lanes):
            return False
        return lanes <= queue.keys()

    async def scan(self, lane: int) -> None:
        """One lane scan: probe, send a batch if the head is due, and always reschedule (unless
        the worker is stopping)."""
        if lane not in self.membership.lanes or self.membership.expired() or self.relay.stopped:
            # Not ours (any more), or not now: membership reschedules it if it comes back, and
            # the next wake-up probe looks at it again.
            self._due.discard(lane)
            return
        try:
            result = await self._scan(lane)
        except StoreError as exc:  # a probe or a pooled connection failed
            result = self._failed(lane, exc)
        self._scanned(lane, result)

    def _failed(self, lane: int, exc: StoreError) -> ScanResult:
        """The result of a scan whose probe or pooled connection failed (logged, throttled)."""
        detail = str(exc)
        self.log.warning(
            ("scan_failed", shape(detail)),
            "lane %s of store %s: %s; retrying in %.1f s",
            lane,
            self.store.name,
            detail,
            self.relay.backoff,
            extra={"action": "scan_failed", "store": self.store.name, "lane": lane},
        )
        return ScanResult(lane, Scan.FAILED, self.relay.backoff, detail=detail)

    def _scanned(self, lane: int, result: ScanResult) -> None:
        """Count a lane scan's result and schedule the lane's next scan from it (none once
        the worker is stopping)."""
        if result.scan is Scan.STOPPED:
            return
        self.stats.record(result)
        if result.scan is Scan.UNAVAILABLE:
            self.log.warning(
                ("unavailable", shape(result.detail)),
                "store %s: rows wait for a broker that cannot be used now: %s (no attempt is "
                "counted; lanes are retried every %.1f s)",
                self.store.name,
                result.detail,
                self.relay.backoff,
                extra={"action": "transport_unavailable", "store": self.store.name, "lane": lane},
            )
        elif result.scan is Scan.WAITING:
            self.log.warning(
                ("waiting",),
                "store %s: no batch connection came free within %.2f s: every connection the "
                "worker may open (worker.max_connections = %s) is in use; lanes wait their turn "
                "(raise worker.max_connections, or serve fewer databases per process)",
                self.store.name,
                CONNECTION_WAIT,
                self.database.budget.limit,
                extra={"action": "connections_busy", "store": self.store.name, "lane": lane},
            )
        elif result.scan is Scan.SENT and result.sent and logger.isEnabledFor(logging.DEBUG):
            # Asked first: the arguments (a dict for ``extra``) would be built for every lane.
            logger.debug(
                "lane %s: sent %s",
                lane,
                result.sent,
                extra={"action": "batch", "store": self.store.name, "lane": lane},
            )
        # An empty lane or one a batch drained waits for a notification or the next poll.
        quiet = result.scan is Scan.EMPTY or (result.scan is Scan.SENT and result.next_in > 0)
        now = self.now()
        if result.scan in (Scan.UNAVAILABLE, Scan.FAILED):
            self._held[lane] = now + result.next_in
            # A notification that came while this scan ran asked for another scan at once:
            # the hold wins (it is scheduled again below, at the hold's end).
            self.queue.discard(lane)
        else:
            self._held.pop(lane, None)
        if lane in self.membership.lanes and not quiet:
            if result.scan in (Scan.SENT, Scan.WAITING):
                # Rows are left (the batch read a full batch or was cut short, or a probe just
                # saw the head due): the next scan needs no probe to know that.
                self._due.add(lane)
            self.queue.schedule(lane, now + result.next_in)

    async def _scan(self, lane: int) -> ScanResult:
        ends = self.window.opened_by(lane)
        if ends is not None:
            # This lane opened a wake_linger window: its batch goes at the window's end, with
            # the lanes woken meanwhile (WakeWindow).
            wait = ends - self.now()
            if wait > 0:
                await asyncio.sleep(wait)
            self.window.waited(ends)
        if lane in self._due:
            self._due.discard(lane)
        else:
            # No due head known: probe first (no writes for idle lanes).
            decided = self.relay.after_probe(await self.prober.head(lane))
            if decided is not None:
                return decided
        return await self._batches.get(lane)

    async def _send_group(self, lanes: list[int]) -> dict[int, ScanResult]:
        """One batch transaction for the lanes whose scans became due in the same event-loop
        turn (at most BATCH_LANES; more make several batches, sent concurrently), widened with
        other lanes already due in the store's queue. Under a light load a lane goes alone, at
        once; under a heavy one, many lanes with a few rows each share one lock, one outcome
        statement and one commit instead of paying for one each. When more lanes wait than
        that batch could take, the lanes are spread over batches of their own (``_spread``),
        each widened, sent concurrently."""
        if self.relay.stopped:  # not worth waiting for a connection
            return {lane: ScanResult(lane, Scan.STOPPED, 0.0) for lane in lanes}
        groups = self._spread(lanes)
        self._connecting += len(groups)
        if len(groups) == 1:
            return await self._send_batch(lanes)
        results: dict[int, ScanResult] = {}
        sent = await asyncio.gather(
            *(self._send_batch(group) for group in groups), return_exceptions=True
        )
        unexpected: BaseException | None = None
        for group, outcome in zip(groups, sent, strict=True):
            if isinstance(outcome, dict):
                results.update(outcome)
            elif isinstance(outcome, StoreError):  # this batch's pooled connection failed
                results.update((lane, self._failed(lane, outcome)) for lane in group)
            else:
                unexpected = unexpected or outcome
        if unexpected is not None:
            raise unexpected
        return results

    def _spread(self, lanes: list[int]) -> list[list[int]]:
        """The batches ``lanes`` go in: one, unless more lanes wait in the store's queue than
        a spread batch is counted for with them (SPREAD_BATCH_LANES in all): then every
        SPREAD_LANES of the ``lanes`` start a batch of their own (at most one for every
        SPREAD_BATCH_LANES lanes due), which takes waiting lanes in turn (up to
        WIDE_BATCH_LANES each, at most half of those due). A backlog over many lanes then
        keeps a batch in flight per SPREAD_LANES slots (their round trips and the broker's
        acknowledgements overlap) instead of one per BATCH_LANES slots. Only as many as the
        worker's connection budget serves at once: a batch that would wait for a connection
        goes with another one instead."""
        if len(lanes) <= SPREAD_LANES:
            return [lanes]
        waiting = self.queue.due_count(self.now())
        batches = min(
            -(-len(lanes) // SPREAD_LANES), -(-(len(lanes) + waiting) // SPREAD_BATCH_LANES)
        )
        batches = min(batches, self.pool.available() - self._connecting)
        if batches < 2:
            return [lanes]
        return [lanes[index::batches] for index in range(batches)]

    async def _send_batch(self, lanes: list[int]) -> dict[int, ScanResult]:
        try:
            return await self._send_on_connection(lanes)
        except ConnectionsBusy as exc:  # the budget is spent: give the slot back for now
            return {lane: ScanResult(lane, Scan.WAITING, 0.0, detail=str(exc)) for lane in lanes}

    async def _send_on_connection(self, lanes: list[int]) -> dict[int, ScanResult]:
        connecting = True  # counted in _connecting (by _send_group) until it has one
        try:
            async with self.pool.connection("get a batch connection", wait=CONNECTION_WAIT) as conn:
                self._connecting -= 1
                connecting = False
                # Taken once the connection is ours: lanes that became due while it was
                # awaited join too.
                extra = self._widen(lanes)
                try:
                    started = time.perf_counter()
                    results = await self.relay.send_lanes(
                        conn, sorted([*lanes, *(job.key for job in extra)]) if extra else lanes
                    )
                    self.stats.batch_seconds.observe(time.perf_counter() - started)
                except BaseException:
                    for job in extra:  # their next scan comes from the poll (or a notification)
                        self.queue.finish(job)
                    raise
        finally:
            if connecting:
                self._connecting -= 1
        self.stats.observe_acked(results)
        by_lane = {result.lane: result for result in results}
        for job in extra:
            self._scanned(job.key, by_lane.pop(job.key))
            self.queue.finish(job)
        owned = self.membership.lanes
        if not owned.issuperset(lanes) or any(job.key not in owned for job in extra):
            self._release_soon()
        return by_lane

    def _widen(self, lanes: list[int]) -> list[Job[int]]:
        """Jobs of other lanes due in this store's queue whose heads are known to be due (seen
        by a probe, named by a writer's notification or left by a batch), up to
        WIDE_BATCH_LANES lanes in all, taken from the queue for the batch of ``lanes``. Due
        jobs wait in the queue only while every slot is busy: under a light load a batch is
        not widened, except by the lanes of a wake_linger window that has ended
        (WakeWindow): every one of them that waits goes in the first batch after it.

        They ride on the slot of the batch's own scans: the dispatch layer granted that slot
        for one batch transaction (a store's concurrency limit counts batches in flight), and
        a paused store starts no scan, so no batch to widen. A lane whose head is not known to
        be due goes back to wait for a scan of its own (with its probe): no lane is locked,
        and its lease written, without a due head. A batch takes at most half of the lanes
        due, so that others run beside it.
        """
        room = WIDE_BATCH_LANES - len(lanes)
        if room <= 0 or self.membership.expired() or self.relay.stopped:
            return []
        now = self.now()
        taken: list[Job[int]] = []
        gathered = self.window.take_gathered(lanes)
        if gathered:
            # Lanes woken within a wake_linger window that has ended (WakeWindow): all of them
            # that wait, whatever else is due.
            jobs = self.queue.take(gathered[:room], now + self.window.linger)
            taken = self._due_jobs(jobs)
            room -= len(taken)
        # At most half of the lanes still due: the rest start batches of their own beside
        # this one (a backlog held by a few lanes with many rows is drained by transactions
        # side by side, not by one wide one that leaves the other connections idle).
        jobs = self.queue.claim(now, min(room, self.queue.due_count(now) // 2))
        return taken + self._due_jobs(jobs)

    def _due_jobs(self, jobs: list[Job[int]]) -> list[Job[int]]:
        """Of ``jobs`` taken from the queue for a batch, those of owned lanes whose head is
        known to be due; the others are given back (rescheduled as they were, if owned)."""
        taken: list[Job[int]] = []
        owned = self.membership.lanes
        due = self._due
        for job in jobs:
            lane = job.key
            if lane in due and lane in owned:
                due.discard(lane)
                taken.append(job)
            else:
                self.queue.finish(job)
                if lane in owned:
                    self.queue.schedule(lane, job.due)
                else:
                    due.discard(lane)
        return taken

    def _release_soon(self) -> None:
        """Some lanes of a batch that just ended left this member's share while it ran: give
        them up now (the heartbeat skipped them while the batch held them)."""
        if self._releasing is None or self._releasing.done():
            self._releasing = asyncio.ensure_future(self.membership.release_outside())

    async def listen(self, stop: asyncio.Event) -> None:
        """Wake lanes on writers' notifications, through the LISTEN connection the stores of
        the database share, until ``stop`` (polls cover the gaps when it is lost)."""
        listener = self.database.listener
        if listener is None:
            logger.info(
                "store %s: no LISTEN behind a transaction pooler (pooler = 'transaction', no "
                "listen_dsn): probing every poll_interval (%g s); set listen_dsn to a direct "
                "connection or a session-mode pool to be woken at once",
                self.store.name,
                self.relay.poll,
                extra={"action": "listen_off", "store": self.store.name},
            )
            return
        listener.subscribe(self.store, self._notified, self.wake_all)
        try:
            await stop.wait()
        finally:
            await listener.unsubscribe(self.store)

    def tasks(self) -> list[Coroutine[Any, Any, None]]:
        """What runs while the store is served, until ``halt`` is set: heartbeats, LISTEN, the
        fallback poll and the maintenance looks."""
        return [
            self.membership.run(self.halt),
            self.listen(self.halt),
            self.poll(self.halt),
            self.maintenance.watch(self.halt),
        ]

    async def open(self) -> None:
        """Take what the store needs, in order: its dispatch gate's connection, its transports
        (one shared with other stores starts with the first), its database's shared
        connections (the first store of the database reserves them in the worker's budget), a
        schema check, a first heartbeat (the member joins) and the maintenance schedule. If a
        step fails, what was taken is given back (``close``) and the error propagates."""
        try:
            if self.gate is not None:
                await self.gate.open()
                self._gate_open = True
            await self.shared.acquire(self.transports.values(), close_within=self.stop_budget())
            self._transports_held = True
            await self.database.attach(self.store)
            self._attached = True
            async with self.housekeeping.connection("check the schema", urgent=True) as conn:
                await self.statements.prepare(conn)
            await self.membership.beat()
            self._joined = True
            self.maintenance.start()
        except BaseException:
            await self.close()
            raise
        self.opened = True

    async def close(self, stop_by: float | None = None) -> None:
        """Give back what ``open`` took: roll back batches still in flight, leave the
        membership (releasing every lane), close the connections, the gate and the transports
        no other store uses, within ``stop_by`` (time.monotonic(); default: half a lease from
        now). Calling it again waits for the first call."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close(stop_by))
        await self._closing

    async def _close(self, stop_by: float | None) -> None:
        if stop_by is None:
            stop_by = time.monotonic() + self.stop_budget()
        self.opened = False
        self.halt.set()
        # After a graceful stop no batch is left (the worker group waited for its scans); after
        # a cancellation, batches still in flight roll back first: leaving releases the lanes,
        # and a batch would hold its lanes' lease rows locked until it ended.
        await self._batches.close()
        if self._releasing is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._releasing
        if self._joined:
            await self.membership.leave()
        if self._waking is not None:
            self._waking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._waking
        await self.prober.close()
        if self._attached:  # the last store of the database out closes its connections
            self._attached = False
            await self.database.detach(self.store)
        if self.gate is not None and self._gate_open:
            await self.gate.close()
        if self._transports_held:
            within = max(stop_by - time.monotonic(), CLOSE_FLOOR)
            await self.shared.release(self.transports.values(), close_within=within)
        for log in self._logs():
            log.flush()

    def stop_budget(self) -> float:
        """Seconds a stop may take: every batch in flight ends within half a lease."""
        return self.store.lease_duration.total_seconds() / 2

    def _logs(self) -> tuple[ThrottledLog, ...]:
        """The throttled logs of this store's parts (their held-back counts are written by
        poll() once an interval ends, and at close)."""
        maintenance = self.maintenance
        listener = self.database.listener
        return (
            self.log,
            self.relay.log,
            self.membership.log,
            maintenance.log,
            maintenance.sender.log,
            *(() if listener is None else (listener.log,)),
        )


class Worker:
    """Relays the ordered rows of ``stores`` until stopped. See the module docstring."""

    def __init__(
        self,
        stores: Sequence[StoreSettings],
        *,
        transports: Mapping[str, Mapping[str, Transport]] | None = None,
        settings: WorkerSettings | None = None,
        instance_id: str | None = None,
        cluster_state: ClusterState | None = None,
        tracer_provider: Any | None = None,
    ) -> None:
        """``cluster_state`` defaults to each store's PostgreSQL queue state (pause and
        concurrency limits set with ``relayer queue``), one dispatcher connection per database.
        ConfigurationError if ``settings.max_connections`` cannot serve these stores.
        ``tracer_provider`` (an OpenTelemetry SDK TracerProvider) defaults to the global one;
        without a configured provider the worker does no tracing work (relayer.tracing).
        ``stores`` may be empty when stores are added later (``add_store``)."""
        names = [store.name for store in stores]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ConfigurationError(
                "stores",
                duplicates[0],
                "is named twice; store names are case-sensitive and unique in a process",
            )
        self.settings = settings or WorkerSettings()
        self.member = instance_id or new_instance_id()
        self.clock = MonotonicClock()
        # Every store's database shares its connections; all together within the budget.
        self.connections: ConnectionPlan = plan_connections(
            stores, self.settings, dispatcher=cluster_state is None
        )
        self.databases = Databases(self.settings, self.connections.limit)
        self._dispatchers: dict[DatabaseKey, DispatcherConnection] = {}
        built = transports if transports is not None else _build_transports(stores)
        self._tracer = relay_tracer(tracer_provider)
        # Which stores use which transports (shared ones start once, close with their last).
        self.shared_transports = SharedTransports()
        # With the default cluster state, each store's queues are routed to its own gate.
        self._routes: RoutedClusterState | None = None
        if cluster_state is None:
            cluster_state = self._routes = RoutedClusterState({})
        self.runtimes: dict[str, StoreRuntime] = {}
        self._maintenance: dict[str, Maintenance] = {}
        self._weights: dict[str, int] = {}  # weights given to add_store
        self._joining: dict[str, StoreSettings] = {}
        self._leaving: set[str] = set()
        self._store_tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] | None = None
        self._phase: Literal["new", "opening", "serving", "stopping", "stopped"] = "new"
        # Readiness conditions of what serves the worker (a template's discovery): each
        # returns None when satisfied, else why the worker is not ready.
        self.readiness_checks: list[Callable[[], str | None]] = []
        for store in stores:
            self._register(self._runtime(store, built.get(store.name, {})))
        self.group: WorkerGroup[int] = WorkerGroup(
            self._policy(names) if names else None,
            self._sources(),
            self._handle,
            pool_size=self.connections.slots,
            cluster_state=cluster_state,
            clock=self.clock,
            name=f"relayer:{self.member}",
        )
        self.started = asyncio.Event()

    def _runtime(self, store: StoreSettings, transports: Mapping[str, Transport]) -> StoreRuntime:
        """A store's runtime on its database's shared connections."""
        return StoreRuntime(
            store,
            transports,
            self.member,
            self.databases.get(store),
            self.clock.now,
            tracer=self._tracer,
            gate=self._gate(store) if self._routes is not None else None,
            shared=self.shared_transports,
        )

    def _gate(self, store: StoreSettings) -> PostgresClusterState:
        """A store's cluster gate on its database's dispatcher connection (shared)."""
        database = self.databases.get(store)
        dispatcher = self._dispatchers.get(database.key)
        if dispatcher is None:
            dispatcher = self._dispatchers[database.key] = DispatcherConnection(
                database.connect_dispatcher,
                pinned=store.pooler == "transaction",
                budget=self.databases.budget,
            )
        return PostgresClusterState(store, dispatcher=dispatcher)

    def _replan(self, joining: StoreSettings | None = None) -> ConnectionPlan:
        """The connection plan of the stores served, joining and, if given, ``joining`` (the
        ConfigurationError of plan_connections if the budget cannot hold them), put in force:
        the budget's limit (when computed) and the group's slots follow it."""
        stores = [runtime.store for runtime in self.runtimes.values()]
        stores += [store for name, store in self._joining.items() if name not in self.runtimes]
        if joining is not None:
            stores.append(joining)
        plan = plan_connections(stores, self.settings, dispatcher=self._routes is not None)
        self.connections = plan
        self.databases.budget.set_limit(plan.limit)
        self.group.pool_size = plan.slots
        return plan

    def _register(self, runtime: StoreRuntime) -> None:
        name = runtime.store.name
        self.runtimes[name] = runtime
        self._maintenance[runtime.maintenance.queue.name] = runtime.maintenance
        if self._routes is not None and runtime.gate is not None:
            self._routes.route((name, maintenance_queue(name)), runtime.gate)

    def _unregister(self, name: str) -> None:
        runtime = self.runtimes.pop(name, None)
        if runtime is not None:
            self._maintenance.pop(runtime.maintenance.queue.name, None)
        if self._routes is not None:
            self._routes.unroute((name, maintenance_queue(name)))
        self._weights.pop(name, None)
        self._store_tasks.pop(name, None)

    def _serving(self) -> list[StoreRuntime]:
        """The stores the group dispatches: served, and not leaving."""
        return [r for name, r in self.runtimes.items() if name not in self._leaving]

    def _sources(self) -> list[MemoryQueue[int]]:
        serving = self._serving()
        return [r.queue for r in serving] + [r.maintenance.queue for r in serving]

    async def _regroup(self) -> None:
        """Give the group the stores served now (from its next pass on)."""
        names = [runtime.store.name for runtime in self._serving()]
        await self.group.reconfigure(self._policy(names) if names else None, self._sources())

    def _stopping(self) -> float:
        """Stop claiming jobs and admitting rows; when the stop must be done (every batch in
        flight ends within half a lease of its start, so by then)."""
        self._phase = "stopping"
        self.group.stop()
        for runtime in self.runtimes.values():
            runtime.relay.stop()
            runtime.halt.set()
        longest = max((runtime.stop_budget() for runtime in self.runtimes.values()), default=0.0)
        return time.monotonic() + longest

    async def _finish_jobs(self, group: asyncio.Task[None], stop_by: float) -> None:
        """Let the running jobs finish until ``stop_by``; cancel what is left then (a batch
        rolls back: its rows stay for the next owner)."""
        done, _ = await asyncio.wait({group}, timeout=max(stop_by - time.monotonic(), 0.0))
        if done:
            group.result()
            return
        logger.warning(
            "worker %s: jobs still running at the end of the stop budget (lease_duration / 2) "
            "were cancelled; their rows are sent by the next owner",
            self.member,
            extra={"action": "stop_cancelled", "member": self.member},
        )
        group.cancel()
        await asyncio.wait({group})

    def _policy(self, names: Sequence[str]) -> Strict | Weighted:
        # Maintenance queues hold at most one job per task, so they can never take more than
        # a few slots: weight 1 (Weighted), or first in line (Strict, so that lanes that are
        # always busy cannot starve the recovery of unordered rows).
        maintenance = [maintenance_queue(name) for name in names]
        if self.settings.policy == "strict":
            order = [name for name in self.settings.weights if name in names]
            return Strict(*maintenance, *order, *[name for name in names if name not in order])
        weights = [(name, self.weight(name)) for name in names]
        return Weighted(weights + [(queue, 1) for queue in maintenance])

    def weight(self, name: str) -> int:
        """Store ``name``'s weight in the Weighted group: the one add_store or set_weight gave,
        else worker.weights, else 1."""
        return self._weights.get(name) or self.settings.weights.get(name, 1)

    async def _handle(self, job: Job[int]) -> None:
        maintenance = self._maintenance.get(job.queue)
        if maintenance is not None:
            await maintenance.run(job.key)
            return
        runtime = self.runtimes.get(job.queue)
        if runtime is not None:  # None: a job of a store that has left
            await runtime.scan(job.key)

    def readiness(self) -> tuple[bool, str]:
        """Whether this worker serves every store: started, and each store's heartbeat
        succeeded within the last lease (the answer of ``/readyz``)."""
        if not self.started.is_set():
            return False, "starting"
        lapsed = [
            name
            for name, runtime in self.runtimes.items()
            if runtime.opened and runtime.membership.expired()
        ]
        if lapsed:
            return False, "heartbeats failing for " + ", ".join(lapsed)
        for check in self.readiness_checks:
            reason = check()
            if reason is not None:
                return False, reason
        return True, "ready"

    @property
    def lanes(self) -> dict[str, frozenset[int]]:
        """The lanes each store's membership currently gives this worker."""
        return {name: runtime.membership.lanes for name, runtime in self.runtimes.items()}

    # -- stores joining and leaving ----------------------------------------------------------

    async def add_store(
        self,
        store: StoreSettings,
        transports: Mapping[str, Transport] | None = None,
        *,
        weight: int | None = None,
    ) -> None:
        """Serve ``store`` too. Before ``run`` it is registered (run opens it); while the
        worker serves, its runtime opens now (schema check, membership join, connections;
        a failure propagates and leaves nothing behind) and its queues join the group.
        ``transports`` defaults to the store's own (built from its settings); ``weight`` to
        worker.weights, else 1. ConfigurationError if the name is served already, UsageError
        while the worker starts or stops."""
        name = store.name
        if name in self.runtimes or name in self._joining:
            raise ConfigurationError(
                "stores",
                name,
                "is named twice; store names are case-sensitive and unique in a process",
            )
        if weight is not None and (isinstance(weight, bool) or weight < 1):
            raise ConfigurationError(f"stores.{name}.weight", weight, "weights are >= 1")
        if self._phase not in ("new", "serving"):
            raise UsageError(
                f"store {name!r} cannot join worker {self.member} while it is {self._phase}; "
                "add it before run() or once worker.started is set"
            )
        if transports is None:
            transports = _build_transports([store])[name]
        self._replan(store)  # refused if the budget has no room for its database
        runtime = self._runtime(store, transports)
        if weight is not None:
            self._weights[name] = weight
        if self._phase == "new":
            self._register(runtime)
            await self._regroup()
            return
        self._joining[name] = store
        try:
            await runtime.open()
            if self._phase != "serving":  # the worker began stopping meanwhile
                await runtime.close()
                raise UsageError(f"worker {self.member} stopped while store {name!r} joined")
        except BaseException:
            self._weights.pop(name, None)
            self._joining.pop(name, None)
            self._replan()
            raise
        finally:
            self._joining.pop(name, None)
        self._register(runtime)
        self._start_tasks(runtime)
        await self._regroup()
        logger.info(
            "worker %s serving store %s too",
            self.member,
            name,
            extra={"action": "store_join", "member": self.member, "store": name},
        )

    async def set_weight(self, name: str, weight: int | None) -> None:
        """Change store ``name``'s weight (None: back to worker.weights, else 1) from the
        group's next pass on; its credit so far is kept."""
        if name not in self.runtimes:
            raise UsageError(f"store {name!r} is not served by worker {self.member}")
        if weight is None:
            self._weights.pop(name, None)
        else:
            self._weights[name] = weight
        await self._regroup()

    async def remove_store(self, name: str) -> None:
        """Stop serving store ``name``, gracefully: its queues leave the group (no new scan),
        its batches in flight admit no new row and finish (within half a lease, then they are
        rolled back), then it leaves the membership (releasing its lanes) and closes its
        connections and the transports no other store uses."""
        runtime = self.runtimes.get(name)
        if runtime is None or name in self._leaving:
            raise UsageError(f"store {name!r} is not served by worker {self.member}")
        if self._phase == "new":
            self._unregister(name)
            self._replan()
            await self._regroup()
            return
        if self._phase != "serving":
            raise UsageError(
                f"store {name!r} cannot leave worker {self.member} while it is {self._phase}"
            )
        self._leaving.add(name)
        try:
            await self._regroup()
            runtime.relay.stop()
            stop_by = time.monotonic() + runtime.stop_budget()
            await self._drained(runtime, stop_by)
            runtime.halt.set()
            tasks = self._store_tasks.get(name, [])
            if tasks:
                await asyncio.wait(tasks)
            await runtime.close(stop_by)
        finally:
            self._leaving.discard(name)
            self._unregister(name)
            self._replan()  # its database's connections are closed if it was the last one
        logger.info(
            "worker %s no longer serves store %s",
            self.member,
            name,
            extra={"action": "store_leave", "member": self.member, "store": name},
        )

    async def _drained(self, runtime: StoreRuntime, stop_by: float) -> None:
        """Wait until the store's running jobs have finished, at most until ``stop_by`` (its
        close then rolls back the batches still in flight)."""
        finished = asyncio.gather(
            self.group.finished(runtime.queue), self.group.finished(runtime.maintenance.queue)
        )
        try:
            await asyncio.wait_for(finished, max(stop_by - time.monotonic(), 0.0))
        except TimeoutError:
            logger.warning(
                "store %s: jobs still running half a lease after it began leaving worker %s "
                "are rolled back; their rows are sent by the next owner",
                runtime.store.name,
                self.member,
                extra={"action": "stop_cancelled", "store": runtime.store.name},
            )

    def _start_tasks(self, runtime: StoreRuntime) -> None:
        assert self._spawn is not None
        self._store_tasks[runtime.store.name] = [self._spawn(task) for task in runtime.tasks()]

    # -- running -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set (or the task is cancelled), then shut down gracefully:
        finish the batches in flight, release every lane and leave the membership."""
        stop = stop or asyncio.Event()
        stop_by: float | None = None
        if self._phase != "new":
            raise UsageError(f"worker {self.member} has run already; create a new Worker")
        self.group.validate()
        self._phase = "opening"
        serving = False
        try:
            for runtime in list(self.runtimes.values()):
                await runtime.open()
            names = ", ".join(self.runtimes) or "no store yet"
            logger.info(
                "worker %s serving %s",
                self.member,
                names,
                extra={"action": "start", "member": self.member},
            )
            logger.info(
                "worker %s: %s",
                self.member,
                self.connections.describe(),
                extra={"action": "connection_budget", "member": self.member},
            )
            serving = True
            async with asyncio.TaskGroup() as tasks:
                self._spawn = tasks.create_task
                for runtime in self.runtimes.values():
                    self._start_tasks(runtime)
                group = tasks.create_task(self.group.run())
                self._phase = "serving"
                self.started.set()
                await stop.wait()
                stop_by = self._stopping()
                await self._finish_jobs(group, stop_by)
        finally:
            self._spawn = None
            stop.set()
            if stop_by is None:
                stop_by = self._stopping()
            # Together: a stalled broker's transport must not use up the others' time.
            closed = await asyncio.gather(
                *(runtime.close(stop_by) for runtime in self.runtimes.values()),
                return_exceptions=True,
            )
            self._phase = "stopped"
            # A start-up failure is reported by whoever awaited run() (the CLI prints it): an
            # INFO "stopped" line just before that error would only confuse.
            logger.log(
                logging.INFO if serving else logging.DEBUG,
                "worker %s stopped" if serving else "worker %s stopped before serving",
                self.member,
                extra={"action": "stop"},
            )
        for outcome in closed:
            if isinstance(outcome, BaseException):
                raise outcome


def probe_parts(lanes: int) -> list[range]:
    """The lane ranges a wake-up probe of a store with ``lanes`` lanes looks at, one query
    each, in order: every lane at once, or FIRST_PROBE_LANES first and then the rest."""
    if lanes <= 2 * FIRST_PROBE_LANES:
        return [range(lanes)]
    return [range(FIRST_PROBE_LANES), range(FIRST_PROBE_LANES, lanes)]


def _build_transports(stores: Sequence[StoreSettings]) -> dict[str, dict[str, Transport]]:
    from relayer.transports.registry import create_transports

    return {store.name: create_transports(store) for store in stores}
