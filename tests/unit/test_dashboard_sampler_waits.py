"""StoreSampler.wait_newer under many concurrent waiters: timeouts, new snapshots and waiters
cancelled (a browser closing its event stream) at the same moments never leave a waiter
waiting on a lock it no longer holds."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from relayer.dashboard.sampler import StoreSampler
from relayer.settings import store_settings


def sampler() -> StoreSampler:
    store = store_settings(
        name="orders",
        dsn="postgresql://nowhere/db",
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    pool: Any = None  # never used: no snapshot is taken
    return StoreSampler(store, pool)


async def test_waiters_time_out_see_new_snapshots_and_cancel_without_lock_errors() -> None:
    waits = sampler()
    chance = random.Random(7)
    stop = asyncio.Event()

    async def publish() -> None:  # new snapshots at random moments, as run() makes them
        while not stop.is_set():
            await asyncio.sleep(chance.random() * 0.002)
            async with waits._changed:
                waits._version += 1
                waits._changed.notify_all()

    async def stream() -> None:  # one event stream: waits, sometimes for very little
        while True:
            await waits.wait_newer(waits._version, chance.random() * 0.002)

    publisher = asyncio.create_task(publish())
    streams = [asyncio.create_task(stream()) for _ in range(20)]
    for _ in range(300):  # browsers close their streams at random moments; others open
        await asyncio.sleep(chance.random() * 0.002)
        index = chance.randrange(len(streams))
        streams[index].cancel()
        streams[index] = asyncio.create_task(stream())
        failed = [task for task in streams if task.done() and not task.cancelled()]
        assert not failed, [task.exception() for task in failed]
    stop.set()
    await publisher
    for task in streams:
        assert not task.done(), task.exception()
        task.cancel()
    await asyncio.gather(*streams, return_exceptions=True)
