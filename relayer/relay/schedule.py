"""The lane schedule: the one owner of which lanes of a store are queued, known due or held.

A lane's scan is a job of the store's dispatch queue (``queue``), keyed by lane number and due at
a time; the worker group runs it in a free slot. Beside the queue the schedule knows:

- which lanes are *known due*: a probe saw their head due, a writer's notification named them,
  or a batch left rows. Their scan skips its own probe, a batch of other lanes may take them
  (``take``, ``claim``), and wake-up probes leave them out. Only this member sends its lanes,
  so a head seen due stays due until the lane's next scan;
- which lanes are *held*: their last scan met a broker or database that could not be used. No
  wake-up (a writer's NOTIFY, a probe) scans them before their retry backoff is over, so an
  outage costs one attempt per lane per backoff however fast rows are written.

Every other part of the relay asks the schedule, and only the schedule changes these sets.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from relayer.dispatch import Job, MemoryQueue
from relayer.relay.results import Scan, ScanResult


class LaneSchedule:
    """Queued, known-due and held lanes of one store in this member; ``owned()`` tells the
    lanes the member owns now (its membership's share)."""

    def __init__(
        self, store: str, now: Callable[[], float], owned: Callable[[], frozenset[int]]
    ) -> None:
        self.queue: MemoryQueue[int] = MemoryQueue(store)
        self.now = now
        self.owned = owned
        self._due: set[int] = set()
        self._held: dict[int, float] = {}

    # -- what wake-ups tell ----------------------------------------------------------------

    def at(self, lane: int, due: float) -> None:
        """Scan ``lane`` at ``due``, or once its hold after an outage is over if later."""
        held = self._held.get(lane)
        if held is not None:
            if held > due:
                due = held
            else:
                del self._held[lane]
        self.queue.schedule(lane, due)

    def due_at(self, lane: int, due: float) -> None:
        """``lane``'s head is known due (no probe needed): scan it at ``due``."""
        self._due.add(lane)
        self.at(lane, due)

    def free(self, lane: int) -> bool:
        """Nothing waits for ``lane``: no scan of it is waiting or running, no outage holds
        it."""
        return lane not in self._held and not self.queue.holds(lane)

    def known_due(self) -> frozenset[int]:
        return frozenset(self._due)

    def queued(self) -> set[int]:
        """Lanes whose scan is waiting or running."""
        return self.queue.keys()

    def every_lane_queued(self) -> bool:
        """Every lane this member owns has a scan waiting or running."""
        queue = self.queue
        lanes = self.owned()
        if not lanes or len(queue) + queue.running < len(lanes):
            return False
        return lanes <= queue.keys()

    def keep(self, lanes: Collection[int], lane_count: int) -> None:
        """The member's share is ``lanes`` now: forget every other lane."""
        for lane in range(lane_count):
            if lane not in lanes:
                self.queue.discard(lane)
                self._due.discard(lane)
                self._held.pop(lane, None)

    # -- what a scan asks and tells -----------------------------------------------------------

    def take_due(self, lane: int) -> bool:
        """Whether ``lane``'s head is known due (its scan then needs no probe); forgotten."""
        if lane in self._due:
            self._due.discard(lane)
            return True
        return False

    def forget(self, lane: int) -> None:
        """``lane`` is not scanned now (not owned, or the member is stopping)."""
        self._due.discard(lane)

    def scanned(self, lane: int, result: ScanResult) -> None:
        """Schedule ``lane``'s next scan from how its scan ended (none once the member is
        stopping, nor for a lane no longer owned)."""
        scan = result.scan
        if scan is Scan.STOPPED:
            return
        # An empty lane or one a batch drained waits for a notification or the next poll.
        quiet = scan is Scan.EMPTY or (scan is Scan.SENT and result.next_in > 0)
        now = self.now()
        if scan is Scan.UNAVAILABLE or scan is Scan.FAILED:
            self._held[lane] = now + result.next_in
            # A notification that came while this scan ran asked for another scan at once:
            # the hold wins (it is scheduled again below, at the hold's end).
            self.queue.discard(lane)
        else:
            self._held.pop(lane, None)
        if not quiet and lane in self.owned():
            if scan is Scan.SENT or scan is Scan.WAITING:
                # Rows are left (the batch read a full batch or was cut short, or a probe just
                # saw the head due): the next scan needs no probe to know that.
                self._due.add(lane)
            self.queue.schedule(lane, now + result.next_in)

    # -- what a batch takes ---------------------------------------------------------------------

    def due_count(self, now: float) -> int:
        """Scans due at ``now`` and waiting for a slot."""
        return self.queue.due_count(now)

    def take(self, lanes: list[int], until: float) -> list[Job[int]]:
        """The jobs of ``lanes`` due by ``until`` whose heads are known due, taken from the
        queue for a batch (the others are given back)."""
        return self._known_due(self.queue.take(lanes, until))

    def claim(self, now: float, most: int) -> list[Job[int]]:
        """Up to ``most`` jobs due at ``now`` whose heads are known due, taken for a batch."""
        return self._known_due(self.queue.claim(now, most))

    def finish(self, jobs: Iterable[Job[int]]) -> None:
        """Jobs a batch took are over (their lanes' next scans were scheduled, or come from a
        wake-up)."""
        for job in jobs:
            self.queue.finish(job)

    def _known_due(self, jobs: list[Job[int]]) -> list[Job[int]]:
        """Of ``jobs`` taken from the queue for a batch, those of owned lanes whose head is
        known to be due; the others are given back (rescheduled as they were, if owned)."""
        taken: list[Job[int]] = []
        owned = self.owned()
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
