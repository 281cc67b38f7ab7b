"""Time for the dispatch layer: a monotonic clock, and a manual one for deterministic tests.

Due times are floats on the clock's own timeline (seconds). The relay converts a database
timestamp into it as ``clock.now() + (deliver_at - database_now).total_seconds()``, so a jump of
the wall clock never reorders or stalls the scans. A clock never goes backwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> float:
        """The current time in seconds on this clock's timeline."""
        ...

    async def wait(self, wake: asyncio.Event, deadline: float | None) -> None:
        """Return when ``wake`` is set or the clock reaches ``deadline`` (None: no deadline)."""
        ...


class MonotonicClock:
    """``time.monotonic()``, the clock asyncio's event loop runs on."""

    def now(self) -> float:
        return time.monotonic()

    async def wait(self, wake: asyncio.Event, deadline: float | None) -> None:
        if deadline is None:
            await wake.wait()
            return
        delay = max(0.0, deadline - self.now())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await wake.wait()


class ManualClock:
    """A clock that moves only when told to; waits end at once when it passes their deadline.

    For tests: a worker group on a ManualClock plans and waits without real time passing, so
    every schedule is reproducible and a test of hours of virtual time runs in milliseconds.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._numbers = itertools.count()

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` and end the waits whose deadline has come."""
        if seconds < 0:
            raise ValueError(f"a clock never goes backwards; advance({seconds!r})")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    @property
    def next_deadline(self) -> float | None:
        """The earliest deadline someone is waiting for (None when nobody waits on time)."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    async def wait(self, wake: asyncio.Event, deadline: float | None) -> None:
        if wake.is_set() or (deadline is not None and deadline <= self._now):
            return
        waiter = asyncio.ensure_future(wake.wait())
        waits: set[asyncio.Future[Any]] = {waiter}
        if deadline is not None:
            timer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._sleepers, (deadline, next(self._numbers), timer))
            waits.add(timer)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in waits:
                future.cancel()
