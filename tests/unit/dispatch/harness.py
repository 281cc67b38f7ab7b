"""Helpers for driving worker groups in tests: handlers the test finishes, a group runner."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import Any

from relayer.dispatch import Job, WorkerGroup


class Held:
    """A handler whose jobs run until the test lets them finish."""

    def __init__(self) -> None:
        self.started: list[Job[Any]] = []
        self._waiting: list[tuple[Job[Any], asyncio.Event]] = []
        self.finished = 0

    async def __call__(self, job: Job[Any]) -> None:
        gate = asyncio.Event()
        self.started.append(job)
        self._waiting.append((job, gate))
        await gate.wait()
        self.finished += 1

    @property
    def holding(self) -> int:
        return len(self._waiting)

    def finish(self, count: int | None = None) -> None:
        count = len(self._waiting) if count is None else count
        for _, gate in self._waiting[:count]:
            gate.set()
        del self._waiting[:count]


async def settle(group: WorkerGroup[Any], running: int) -> None:
    """Let finishing handlers leave the pool (event-loop turns, no time), then run a pass."""
    for _ in range(10_000):
        if group.running == running:
            break
        await asyncio.sleep(0)
    assert group.running == running
    waiter = group.next_pass()
    group.wake()
    await waiter


@asynccontextmanager
async def running(
    group: WorkerGroup[Any], held: Held | None = None
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``group`` for the body of the block; stop it, let held jobs end, wait for it."""
    first = group.next_pass()
    task = asyncio.create_task(group.run())
    await first
    try:
        yield task
    finally:
        group.stop()
        if held is not None:
            held.finish()
        await task


def keys(jobs: list[Job[Hashable]]) -> list[Hashable]:
    return [job.key for job in jobs]
