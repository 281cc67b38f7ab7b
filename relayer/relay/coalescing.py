"""Coalescing: lanes asked for in the same event-loop turn are served together.

Every lane asked for in one turn is served at once: the probe of every scan that starts in one
turn becomes one query (relayer.relay.scanner), and the lanes whose batches become due in one
turn share one batch transaction (relayer.relay.grouping).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
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


def _log_unexpected(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error(
            "a coalesced lane probe or batch failed unexpectedly",
            exc_info=task.exception(),
            extra={"action": "probe_failed"},
        )
