"""Scanning: one lane scan, from the slot the dispatch layer gave it to the lane's batch.

A scan that knows its lane's head is due (the lane schedule says so) joins a batch at once;
any other first asks the ``Prober`` (relayer.relay.probes) whether the head is due, without
taking any lock. The scan's result goes to the store's outcomes (counted, scheduled).
"""

from __future__ import annotations

import asyncio

from relayer.errors import StoreError
from relayer.relay.batch import LaneRelay
from relayer.relay.grouping import Grouping
from relayer.relay.membership import Membership
from relayer.relay.outcomes import ScanOutcomes
from relayer.relay.probes import Prober
from relayer.relay.results import ScanResult, after_probe
from relayer.relay.schedule import LaneSchedule
from relayer.relay.wakeups import WakeWindow


class Scanner:
    """Runs the lane scans of one store (``scan``: a job of its dispatch queue)."""

    def __init__(
        self,
        member: str,
        *,
        membership: Membership,
        schedule: LaneSchedule,
        window: WakeWindow,
        prober: Prober,
        batch: LaneRelay,
        grouping: Grouping,
        outcomes: ScanOutcomes,
    ) -> None:
        self.member = member
        self.membership = membership
        self.schedule = schedule
        self.window = window
        self.prober = prober
        self.batch = batch
        self.grouping = grouping
        self.outcomes = outcomes

    async def scan(self, lane: int) -> None:
        """One lane scan: probe, send a batch if the head is due, and always reschedule (unless
        the worker is stopping)."""
        membership = self.membership
        if lane not in membership.lanes or membership.expired() or self.batch.stopped:
            # Not ours (any more), or not now: membership reschedules it if it comes back, and
            # the next wake-up probe looks at it again.
            self.schedule.forget(lane)
            return
        try:
            result = await self._scan(lane)
        except StoreError as exc:  # a probe or a pooled connection failed
            result = self.outcomes.failed(lane, exc)
        self.outcomes.record(lane, result)

    async def _scan(self, lane: int) -> ScanResult:
        window = self.window
        ends = window.opened_by(lane)
        if ends is not None:
            # This lane opened a wake_linger window: its batch goes at the window's end, with
            # the lanes woken meanwhile (WakeWindow).
            wait = ends - self.schedule.now()
            if wait > 0:
                await asyncio.sleep(wait)
            window.waited(ends)
        if not self.schedule.take_due(lane):
            # No due head known: probe first (no writes for idle lanes).
            head = await self.prober.head(lane)
            decided = after_probe(head, self.member, self.batch.poll)
            if decided is not None:
                return decided
        return await self.grouping.send(lane)
