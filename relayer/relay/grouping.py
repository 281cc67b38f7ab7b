"""Grouping: which lanes go in one batch transaction, and on which connection.

Scans that become due in the same event-loop turn send their lanes together (``send``), in one
batch transaction of up to BATCH_LANES lanes on a pooled database connection. Under a light load
a lane goes alone, at once; under a heavy one, many lanes with a few rows each share one lock,
one outcome statement and one commit instead of paying for one each:

- *coalesce*: the lanes whose scans become due in one turn share a batch (chunks of
  BATCH_LANES, sent concurrently);
- *spread*: when more lanes wait than that batch could take, they are spread over batches of
  their own, sent side by side on as many connections as the worker's budget has free;
- *widen*: once a batch has its connection, it takes other lanes already due in the store's
  queue whose heads are known due (up to WIDE_BATCH_LANES), and every lane of a wake_linger
  window that ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from relayer.dispatch import Job
from relayer.errors import ConnectionsBusy, StoreError
from relayer.relay.batch import BATCH_LANES, SPREAD_BATCH_LANES, WIDE_BATCH_LANES, LaneRelay
from relayer.relay.coalescing import Coalescer
from relayer.relay.membership import Membership
from relayer.relay.outcomes import CONNECTION_WAIT, ScanOutcomes
from relayer.relay.results import Scan, ScanResult
from relayer.relay.schedule import LaneSchedule
from relayer.relay.stats import StoreStats
from relayer.relay.wakeups import WakeWindow
from relayer.store.budget import StoreConnections

# Under a backlog over more lanes than a batch takes, the scans due together start a batch per
# this many of them, each taking waiting lanes (Grouping._spread): 20 slots keep about five
# batches in flight. More batches at once overlapped no more work on 2 cores and cost each
# PostgreSQL backend more (connections that had not run the statements yet, contention).
SPREAD_LANES = 4


class Grouping:
    """Groups one store's due lanes into batch transactions on its pooled connections."""

    def __init__(
        self,
        batch: LaneRelay,
        *,
        pool: StoreConnections,
        schedule: LaneSchedule,
        window: WakeWindow,
        membership: Membership,
        stats: StoreStats,
        outcomes: ScanOutcomes,
    ) -> None:
        self.batch = batch
        self.pool = pool
        self.schedule = schedule
        self.window = window
        self.membership = membership
        self.stats = stats
        self.outcomes = outcomes
        # Scans due in the same event-loop turn send their lanes in shared transactions.
        self._batches: Coalescer[ScanResult] = Coalescer(self._send_group, chunk=BATCH_LANES)
        # Batches of _send_group still waiting for their connection (_spread counts them).
        self._connecting = 0
        self._releasing: asyncio.Future[None] | None = None

    async def send(self, lane: int) -> ScanResult:
        """Send ``lane`` in a batch with the lanes due in the same event-loop turn."""
        return await self._batches.get(lane)

    async def _send_group(self, lanes: list[int]) -> dict[int, ScanResult]:
        """One batch transaction for the lanes whose scans became due in the same event-loop
        turn (at most BATCH_LANES), widened with other lanes already due in the store's queue,
        or, when more lanes wait than that batch could take, one batch per group of
        ``_spread``, each widened, sent concurrently."""
        if self.batch.stopped:  # not worth waiting for a connection
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
                results.update((lane, self.outcomes.failed(lane, outcome)) for lane in group)
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
        waiting = self.schedule.due_count(self.schedule.now())
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
        schedule = self.schedule
        try:
            async with self.pool.connection("get a batch connection", wait=CONNECTION_WAIT) as conn:
                self._connecting -= 1
                connecting = False
                # Taken once the connection is ours: lanes that became due while it was
                # awaited join too.
                extra = self._widen(lanes)
                try:
                    started = time.perf_counter()
                    results = await self.batch.send_lanes(
                        conn, sorted([*lanes, *(job.key for job in extra)]) if extra else lanes
                    )
                    self.stats.batch_seconds.observe(time.perf_counter() - started)
                except BaseException:
                    schedule.finish(extra)  # their next scan comes from the poll (or a wake-up)
                    raise
        finally:
            if connecting:
                self._connecting -= 1
        self.stats.observe_acked(results)
        by_lane = {result.lane: result for result in results}
        for job in extra:
            self.outcomes.record(job.key, by_lane.pop(job.key))
            schedule.finish((job,))
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
        due, so that others run beside it (a backlog held by a few lanes with many rows is
        drained by transactions side by side, not by one wide one that leaves the other
        connections idle).
        """
        room = WIDE_BATCH_LANES - len(lanes)
        if room <= 0 or self.membership.expired() or self.batch.stopped:
            return []
        schedule = self.schedule
        now = schedule.now()
        taken: list[Job[int]] = []
        gathered = self.window.take_gathered(lanes)
        if gathered:
            # Lanes woken within a wake_linger window that has ended: all of them that wait,
            # whatever else is due.
            taken = schedule.take(gathered[:room], now + self.window.linger)
            room -= len(taken)
        return taken + schedule.claim(now, min(room, schedule.due_count(now) // 2))

    def _release_soon(self) -> None:
        """Some lanes of a batch that just ended left this member's share while it ran: give
        them up now (the heartbeat skipped them while the batch held them)."""
        if self._releasing is None or self._releasing.done():
            self._releasing = asyncio.ensure_future(self.membership.release_outside())

    async def close(self) -> None:
        """Cancel the batches still in flight (they roll back: their rows stay for the next
        owner) and let a release of lanes that left the share finish."""
        await self._batches.close()
        if self._releasing is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._releasing
