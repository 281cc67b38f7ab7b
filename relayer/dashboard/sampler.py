"""One sampler per store: a snapshot of the store every interval, shared by every viewer.

Requests and event streams read the latest snapshot; however many tabs are open, the store is
read once per interval. A snapshot that takes more than half the interval stretches the next
wait (up to 30 s) instead of piling queries up. Whole-table counts (pending rows per lane) run
in a separate, slower refinement under a statement timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from relayer.dashboard.lanes import LaneMap, lane_map, pending_map
from relayer.dispatch.control import QueueControl, QueueStatus
from relayer.errors import StoreError
from relayer.redact import redact
from relayer.settings import StoreSettings
from relayer.store.dashboard import (
    COUNT_CAP,
    PARKED_CAP,
    TOP_LANES,
    Capped,
    DashboardPool,
    LiveMember,
    SnapshotReading,
    TableCounters,
    read_lane_counts,
    read_snapshot,
)

logger = logging.getLogger(__name__)

RATE_BUCKET = 10.0  # seconds per bucket of the send-rate chart
RATE_BUCKETS = 360  # one hour
MAX_BACKOFF = 30.0
REFINE_TIMEOUT = "10s"


@dataclass(frozen=True, slots=True)
class MemberView:
    instance: str
    host: str
    since: datetime
    heartbeat: datetime
    heartbeat_age: float
    lanes: int  # leased right now
    owned: int = 0  # its share: lanes with lane % members == rank (the heartbeat's ranking)


@dataclass(frozen=True, slots=True)
class Snapshot:
    store: str
    version: int
    taken_at: float  # wall clock, seconds since 1970 (for the data age shown)
    duration_ms: float
    lanes: int
    members: tuple[MemberView, ...]
    lane_map: LaneMap
    pending: Capped
    pending_estimate: int
    unordered_age_seconds: float
    parked_operator: int
    parked_retrying: int
    parked_more: bool
    batches_open: int
    queues: tuple[QueueStatus, ...]

    @property
    def oldest_age_seconds(self) -> float:
        return max(self.lane_map.oldest_age_seconds, self.unordered_age_seconds)

    @property
    def parked(self) -> Capped:
        return Capped(self.parked_operator + self.parked_retrying, self.parked_more)


@dataclass(frozen=True, slots=True)
class Refinement:
    """Pending rows per lane, counted in full (slow on big tables, so in the background)."""

    taken_at: float
    duration_ms: float
    pending_bytes: bytes
    by_lane: dict[int, int]
    total: int


@dataclass(slots=True)
class RateHistory:
    """Rows written, sent and failed per 10 s over the last hour, from the outbox's counters."""

    buckets: deque[tuple[float, int, int, int]] = field(
        default_factory=lambda: deque(maxlen=RATE_BUCKETS)
    )
    _last: tuple[int, int, int] | None = None

    def add(self, now: float, inserted: int, updated: int, deleted: int) -> None:
        counters = (inserted, updated, deleted)
        last, self._last = self._last, counters
        if last is None or any(new < old for new, old in zip(counters, last, strict=True)):
            return  # the first reading, or the statistics were reset
        start = now - now % RATE_BUCKET
        written, failed, sent = (new - old for new, old in zip(counters, last, strict=True))
        if self.buckets and self.buckets[-1][0] == start:
            _, w, s, f = self.buckets[-1]
            self.buckets[-1] = (start, w + written, s + sent, f + failed)
        else:
            self.buckets.append((start, written, sent, failed))

    def forget(self) -> None:
        """No reading this time: the next one starts again (no point for the gap)."""
        self._last = None

    def series(self) -> dict[str, list[float]]:
        return {
            "t": [bucket[0] for bucket in self.buckets],
            "written": [bucket[1] for bucket in self.buckets],
            "sent": [bucket[2] for bucket in self.buckets],
            "failed": [bucket[3] for bucket in self.buckets],
        }


class StoreSampler:
    """Takes ``store``'s snapshot every ``interval`` seconds through ``pool``."""

    def __init__(
        self,
        store: StoreSettings,
        pool: DashboardPool,
        *,
        interval: float = 2.0,
        refine_interval: float = 30.0,
    ) -> None:
        self.store = store
        self.pool = pool
        self.interval = interval
        self.refine_interval = refine_interval
        self.snapshot: Snapshot | None = None
        self.refinement: Refinement | None = None
        self.rates = RateHistory()
        self.error: str | None = None  # the last failure, redacted (shown on every page)
        self.slowed: float | None = None  # the stretched interval while snapshots are slow
        self._version = 0
        self._changed = asyncio.Condition()
        self._heads_seen: dict[int, tuple[int, float]] = {}
        self._wake = asyncio.Event()
        self._closed = False

    # -- reading ----------------------------------------------------------------------------

    async def wait_newer(self, version: int, within: float) -> Snapshot | None:
        """The latest snapshot once it is newer than ``version`` (or None after ``within``
        seconds)."""
        # The timeout cancels the wait in this task, which holds the condition's lock: under
        # asyncio.wait_for the wait ran in a task of its own, and a waiter cancelled or timed
        # out at the moment a snapshot came could release the lock that task had just taken
        # back ("cannot wait on un-acquired lock" in the event stream).
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await self._changed.wait_for(lambda: self._version > version or self._closed)
        return self.snapshot if self._version > version else None

    async def closed(self) -> None:
        """No snapshot will follow (the store was closed): wake every waiter now."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    def refresh_soon(self) -> None:
        """Take the next snapshot now (after an action, so the page shows its effect)."""
        self._wake.set()

    # -- running ----------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._loop(self.sample, self.interval, "snapshot"))
            tasks.create_task(self._loop(self.refine, self.refine_interval, "refinement"))

    async def _loop(self, step: Callable[[], Awaitable[float]], interval: float, what: str) -> None:
        failures = 0
        while True:
            try:
                seconds = await step()
                failures = 0
                if what == "snapshot":
                    self.error = None
            except (StoreError, TimeoutError) as exc:
                failures += 1
                seconds = 0.0
                text = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))
                if what == "snapshot":
                    self.error = f"cannot read the store: {text}"
                if failures == 1 or failures % 30 == 0:
                    logger.warning(
                        "store %s: dashboard %s failed %d time(s): %s; check the database and "
                        "the store's settings",
                        self.store.name,
                        what,
                        failures,
                        text,
                        extra={"action": "dashboard_sample_failed", "store": self.store.name},
                    )
            wait = interval if failures == 0 else min(interval * 2**failures, MAX_BACKOFF)
            if seconds > interval / 2:  # slow: give the database room (Oban #56)
                wait = min(max(wait, seconds * 4), MAX_BACKOFF)
            if what == "snapshot":
                self.slowed = wait if wait > interval else None
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
            else:
                await asyncio.sleep(wait)

    async def sample(self) -> float:
        """Take one snapshot and publish it; returns how long it took (seconds)."""
        started = time.perf_counter()
        stall_after = self.store.lease_duration.total_seconds()
        async with self.pool.connection() as conn:
            reading = await read_snapshot(conn, self.store, stall_after=stall_after)
            # The queue controls leave a driver error as is: the pool words it, in the block.
            queues = await QueueControl(conn, self.store.names).status([self.store.name])
        stalled = self._stalled(dict(reading.stall_candidates), time.monotonic(), stall_after)
        lanes = lane_map(self.store.lanes, reading.lane_heads, stalled)
        if reading.counters is not None:
            self._add_rates(reading.counters, reading.pending)
        duration = time.perf_counter() - started
        self._version += 1
        snapshot = self._snapshot(reading, queues, lanes, duration)
        async with self._changed:
            self.snapshot = snapshot
            self._changed.notify_all()
        return duration

    def _add_rates(self, counters: TableCounters, pending: int) -> None:
        """The counters' point of the rate chart. Partitioned storage deletes no row it sends:
        rows sent (or dropped) are the rows written less the pending rows, known only while
        those are counted exactly (no point while more are pending)."""
        deleted = counters.deleted
        if self.store.storage == "partitioned":
            if pending > COUNT_CAP:
                self.rates.forget()
                return
            deleted = counters.inserted - pending
        self.rates.add(time.time(), counters.inserted, counters.updated, deleted)

    def _snapshot(
        self,
        reading: SnapshotReading,
        queues: tuple[QueueStatus, ...],
        lanes: LaneMap,
        duration: float,
    ) -> Snapshot:
        counters = reading.counters
        return Snapshot(
            store=self.store.name,
            version=self._version,
            taken_at=time.time(),
            duration_ms=duration * 1000,
            lanes=self.store.lanes,
            members=_members(reading.members, lanes, self.store.lanes),
            lane_map=lanes,
            pending=Capped.of(reading.pending),
            pending_estimate=self._estimate(counters),
            unordered_age_seconds=reading.unordered_age_seconds,
            parked_operator=reading.parked_operator,
            parked_retrying=reading.parked_keys - reading.parked_operator,
            parked_more=reading.parked_keys >= PARKED_CAP,
            batches_open=reading.batches_open,
            queues=queues,
        )

    def _estimate(self, counters: TableCounters | None) -> int:
        """The pending rows past the count's cap: the planner's estimate, or (partitioned
        storage, whose outbox keeps sent rows) the background refinement's last full count."""
        if self.store.storage == "partitioned":
            return self.refinement.total if self.refinement is not None else 0
        return max(counters.estimated_rows, counters.live_rows) if counters else 0

    async def refine(self) -> float:
        started = time.perf_counter()
        async with self.pool.connection() as conn:
            counted = await read_lane_counts(conn, self.store, statement_timeout=REFINE_TIMEOUT)
        counts = dict(counted)
        duration = time.perf_counter() - started
        self.refinement = Refinement(
            taken_at=time.time(),
            duration_ms=duration * 1000,
            pending_bytes=pending_map(self.store.lanes, counts),
            by_lane={lane: rows for lane, rows in counts.items() if lane >= 0},
            total=sum(counts.values()),
        )
        return duration

    def _stalled(self, candidates: dict[int, int], now: float, after: float) -> list[int]:
        """The candidate lanes whose head has stayed the same for ``after`` seconds or more
        (candidates: flowing lanes with a head at least that old, and its id's tail)."""
        seen: dict[int, tuple[int, float]] = {}
        stalled: list[int] = []
        for lane, tail in candidates.items():
            previous = self._heads_seen.get(lane)
            since = previous[1] if previous is not None and previous[0] == tail else now
            seen[lane] = (tail, since)
            if now - since >= after:
                stalled.append(lane)
        self._heads_seen = seen
        return stalled


def _members(live: tuple[LiveMember, ...], lanes: LaneMap, count: int) -> tuple[MemberView, ...]:
    """The live members with the lanes each holds now and its share: they come in the
    heartbeat's rank order (the database's order of owners)."""
    held = _owned_lanes(lanes)
    return tuple(
        MemberView(
            instance=member.instance,
            host=member.instance.split(":", 1)[0],
            since=member.since,
            heartbeat=member.heartbeat,
            heartbeat_age=member.heartbeat_age,
            lanes=held.get(member.instance, 0),
            owned=len(range(rank, count, len(live))),
        )
        for rank, member in enumerate(live)
    )


def _owned_lanes(lanes: LaneMap) -> dict[str, int]:
    """Lanes held per owner, from the owner bytes."""
    held = [0] * (len(lanes.owners) + 1)
    for index in set(lanes.owner_bytes):
        if 0 < index <= len(lanes.owners):
            held[index] = lanes.owner_bytes.count(index)
    return {name: held[number] for number, name in enumerate(lanes.owners, 1)}


__all__ = [
    "COUNT_CAP",
    "PARKED_CAP",
    "TOP_LANES",
    "Capped",
    "MemberView",
    "RateHistory",
    "Refinement",
    "Snapshot",
    "StoreSampler",
]
