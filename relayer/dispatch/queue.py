"""Queues: named streams of due jobs, and the interface a worker group claims through.

A claim returns due jobs only, oldest due first, equal due times in enqueue order; a job due in
the future is never returned, and there is no per-job priority. A job has a key: while a job is
running, no other job with its key is claimed, and a schedule for a running key is kept (the
earliest one) and becomes claimable when the running job finishes. That is exactly what the
relay needs for lane scans: one scan per lane at a time, and a NOTIFY never lost.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from relayer.dispatch.policies import DEFAULT_QUEUE, check_queue_name

KeyT = TypeVar("KeyT", bound=Hashable)
Listener = Callable[[], None]


@dataclass(frozen=True, slots=True)
class Job(Generic[KeyT]):
    """One claimed job: its queue, its key, when it became due, and its enqueue number."""

    queue: str
    key: KeyT
    due: float
    sequence: int


class JobSource(Protocol[KeyT]):
    """Where a worker group claims jobs. All calls are synchronous and made on the event loop.

    ``due_count`` and ``claim`` take ``now`` from the group's clock. ``listen`` registers a
    callback the source calls when work may have become claimable earlier than the group
    planned (a new job, an earlier due time, a finished key with a pending schedule).
    """

    @property
    def name(self) -> str: ...

    def due_count(self, now: float, limit: int | None = None) -> int: ...

    def claim(self, now: float, limit: int) -> list[Job[KeyT]]: ...

    def finish(self, job: Job[KeyT]) -> None: ...

    def next_due(self) -> float | None: ...

    def listen(self, listener: Listener) -> None: ...

    def unlisten(self, listener: Listener) -> None: ...


# A waiting job: (due, sequence, key). The tuple itself is the identity: the heap entry is
# current only while the queue's index maps the key to this very object.
_Entry = tuple[float, int, KeyT]


class MemoryQueue(Generic[KeyT]):
    """An in-memory queue of keyed jobs, for one process.

    Waiting jobs sit in two heaps: ``ready`` (due at or before the last ``now`` seen) and
    ``future``. Moving a job from one to the other happens once, so counting due jobs is O(1)
    and claiming n of them is O(n log size). Superseded heap entries are skipped lazily and
    compacted when they outnumber the live ones.
    """

    def __init__(self, name: str = DEFAULT_QUEUE) -> None:
        self._name = check_queue_name(name)
        self._waiting: dict[KeyT, _Entry[KeyT]] = {}
        self._ready: list[_Entry[KeyT]] = []
        self._future: list[_Entry[KeyT]] = []
        self._ready_count = 0
        self._horizon = float("-inf")
        self._running: set[KeyT] = set()
        self._deferred: dict[KeyT, tuple[float, int]] = {}
        self._numbers = itertools.count()
        self._listeners: list[Listener] = []

    def __repr__(self) -> str:
        return (
            f"MemoryQueue({self._name!r}, waiting={len(self._waiting)}, "
            f"running={len(self._running)})"
        )

    @property
    def name(self) -> str:
        return self._name

    def __len__(self) -> int:
        """Jobs waiting (due or not), not counting running ones or pending re-schedules."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def is_running(self, key: KeyT) -> bool:
        return key in self._running

    def keys(self) -> set[KeyT]:
        """Every key with a job: waiting (due or not), running, or pending a re-schedule."""
        return {*self._waiting, *self._running}

    def schedule(self, key: KeyT, due: float) -> bool:
        """Make ``key`` due at ``due``, or earlier if it already waits with an earlier time.

        A key that is running gets the job after it finishes. Returns True when the key's next
        due time moved (a new job or an earlier one), False when an earlier one already stands.
        """
        if key in self._running:
            pending = self._deferred.get(key)
            if pending is not None and pending[0] <= due:
                return False
            sequence = pending[1] if pending is not None else next(self._numbers)
            self._deferred[key] = (due, sequence)
            return True
        current = self._waiting.get(key)
        if current is not None:
            if current[0] <= due:
                return False
            # An earlier due time keeps the job's place among jobs due at the same time.
            self._forget(current)
            entry: _Entry[KeyT] = (due, current[1], key)
        else:
            entry = (due, next(self._numbers), key)
        self._add(entry)
        self._notify()
        return True

    def discard(self, key: KeyT) -> bool:
        """Remove ``key``'s waiting job and pending re-schedule; True if there was one."""
        dropped = self._deferred.pop(key, None) is not None
        entry = self._waiting.pop(key, None)
        if entry is not None:
            if entry[0] <= self._horizon:
                self._ready_count -= 1
            return True
        return dropped

    def due_count(self, now: float, limit: int | None = None) -> int:
        self._advance(now)
        return self._ready_count if limit is None else min(self._ready_count, limit)

    def claim(self, now: float, limit: int) -> list[Job[KeyT]]:
        self._advance(now)
        jobs: list[Job[KeyT]] = []
        while len(jobs) < limit and self._ready_count:
            entry = heapq.heappop(self._ready)
            due, sequence, key = entry
            if self._waiting.get(key) is not entry:
                continue
            del self._waiting[key]
            self._ready_count -= 1
            self._running.add(key)
            jobs.append(Job(self._name, key, due, sequence))
        return jobs

    def holds(self, key: KeyT) -> bool:
        """``key`` has a job: waiting (due or not) or running."""
        return key in self._waiting or key in self._running

    def take(self, keys: Iterable[KeyT], due_by: float) -> list[Job[KeyT]]:
        """Claim the waiting jobs of ``keys`` that are due by ``due_by`` (in the order of
        ``keys``), outside any worker group: each is running until ``finish``. For a caller
        that serves those keys along with a job it was granted (the relay's wake_linger window,
        relayer.worker); a key that is running, or waits for a later time, is left as it is."""
        jobs: list[Job[KeyT]] = []
        for key in keys:
            entry = self._waiting.get(key)
            if entry is None or entry[0] > due_by:
                continue
            self._forget(entry)  # its heap entry is skipped from now on
            self._running.add(key)
            jobs.append(Job(self._name, key, entry[0], entry[1]))
        return jobs

    def finish(self, job: Job[KeyT]) -> None:
        """The job's handler is done: its key may run again (a pending schedule now waits)."""
        self._running.discard(job.key)
        pending = self._deferred.pop(job.key, None)
        if pending is not None:
            self._add((pending[0], pending[1], job.key))
            self._notify()

    def next_due(self) -> float | None:
        """The earliest due time among waiting jobs (None when nothing waits)."""
        for heap in (self._ready, self._future):
            while heap and self._waiting.get(heap[0][2]) is not heap[0]:
                heapq.heappop(heap)
            if heap:
                return heap[0][0]
        return None

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def unlisten(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # -- internals -------------------------------------------------------------------------

    def _add(self, entry: _Entry[KeyT]) -> None:
        self._waiting[entry[2]] = entry
        if entry[0] <= self._horizon:
            heapq.heappush(self._ready, entry)
            self._ready_count += 1
        else:
            heapq.heappush(self._future, entry)
        self._compact()

    def _forget(self, entry: _Entry[KeyT]) -> None:
        del self._waiting[entry[2]]
        if entry[0] <= self._horizon:
            self._ready_count -= 1

    def _advance(self, now: float) -> None:
        if now <= self._horizon:
            return
        self._horizon = now
        future = self._future
        while future and future[0][0] <= now:
            entry = heapq.heappop(future)
            if self._waiting.get(entry[2]) is entry:
                heapq.heappush(self._ready, entry)
                self._ready_count += 1

    def _compact(self) -> None:
        live = len(self._waiting)
        if len(self._ready) + len(self._future) <= 2 * live + 64:
            return
        self._ready = [entry for entry in self._ready if self._waiting.get(entry[2]) is entry]
        self._future = [entry for entry in self._future if self._waiting.get(entry[2]) is entry]
        heapq.heapify(self._ready)
        heapq.heapify(self._future)

    def _notify(self) -> None:
        for listener in tuple(self._listeners):
            listener()
