"""Wake-up coalescing: lanes woken together are served together.

- ``Coalescer``: every lane asked for in the same event-loop turn is served at once; the probe
  of every scan that starts in one turn becomes one query, and the lanes whose batches become
  due in one turn share one batch transaction (relayer.worker groups them with it).
- ``WakeWindow``: the lanes that writers' notifications wake within one ``wake_linger`` go in
  one batch transaction, opened by the first of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Generic, TypeVar

from relayer.tasks import cancel_all, fail_all

logger = logging.getLogger(__name__)

T = TypeVar("T")


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
            fail_all((future for futures in waiting.values() for future in futures), exc)
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
        await cancel_all(self._tasks)


class WakeWindow:
    """The ``wake_linger`` window of one store: when each lane a writer's notification wakes is
    due, so that the lanes woken within one linger share a batch transaction (at a steady rate
    of single-row transactions, a batch per row would cost far more than the rows).

    The lane that opens a window (``wake``) is due at once when nothing else waits for it (no
    scan waiting or running, no outage hold: ``lead``): its dispatch pass and the gate's claim
    run while the window is open, and its scan waits for the window's end (``opened_by``,
    ``waited``), so the claim's round trip is not added to the latency. The lanes woken later
    in the window join it (``join``): due a linger after its end, they are gathered when it
    ends, and the opener's batch takes them from the store's queue (``take_gathered``), riding
    on the slot it was granted, as a widened batch's lanes do. If the opener is late or refused
    (a paused store, no free slot), they are scanned on their own when they come due. A window
    without such an opener is served at its end: every lane of it is due then.

    Times are the store's clock (seconds); a linger of 0 opens no window.
    """

    __slots__ = ("_gathered", "_joining", "_opener", "_openers", "ends", "linger")

    def __init__(self, linger: float) -> None:
        self.linger = linger
        self.ends = float("-inf")  # when the open window ends (-inf: none was opened yet)
        self._opener: int | None = None  # the open window's opener, if its scan went at once
        self._openers: dict[int, float] = {}  # lane -> the end of the window it opened
        self._joining: set[int] = set()  # woken within the open window, after its opener
        self._gathered: set[int] = set()  # joiners of a window that ended: the next batch's

    def is_open(self, now: float) -> bool:
        return now < self.ends

    def wake(self, lane: int, now: float, *, lead: Callable[[int], bool]) -> float:
        """When ``lane``, woken now by a notification, is due: it joins the open window, or
        opens one (and leads it if ``lead(lane)``: nothing else waits for the lane)."""
        if now < self.ends:
            return self.join(lane)
        self._gather()  # the window that ended: its joiners go in the next batch
        self.ends = now + self.linger
        if self.linger > 0 and lead(lane):
            self._opener = lane
            self._openers[lane] = self.ends
            return now
        self._opener = None
        return self.ends

    def join(self, lane: int) -> float:
        """When ``lane``, woken inside the open window (by a notification or a probe), is due."""
        if self._opener is None or lane == self._opener:
            return self.ends
        self._joining.add(lane)
        return self.ends + self.linger

    def opened_by(self, lane: int) -> float | None:
        """The end of the window ``lane`` opened, if its scan is the one starting now (asked
        once per opening: the scan then waits until that end and calls ``waited``)."""
        return self._openers.pop(lane, None)

    def waited(self, ends: float) -> None:
        """An opener waited until ``ends``: if its window is the open one, that window's joiners
        are gathered for the opener's batch."""
        if ends == self.ends:
            self._gather()

    def take_gathered(self, leaving_out: Iterable[int]) -> list[int]:
        """The gathered lanes, ascending, without ``leaving_out`` (the batch's own lanes);
        none are gathered afterwards."""
        if not self._gathered:
            return []
        gathered = sorted(self._gathered.difference(leaving_out))
        self._gathered = set()
        return gathered

    def keep(self, lanes: Collection[int]) -> None:
        """The member's share changed: openers outside ``lanes`` open nothing any more."""
        self._openers = {lane: ends for lane, ends in self._openers.items() if lane in lanes}

    def _gather(self) -> None:
        if self._joining:
            self._gathered |= self._joining
            self._joining = set()


def _log_unexpected(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "a coalesced lane probe or batch failed unexpectedly",
            exc_info=task.exception(),
            extra={"action": "probe_failed"},
        )
