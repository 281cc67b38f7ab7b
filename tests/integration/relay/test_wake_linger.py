"""Wake-ups that arrive within ``wake_linger`` are served together: one batch transaction."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from relayer import Outbox, lane_for
from relayer.settings import StoreSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import pending


def keys_in_distinct_lanes(store: StoreSettings, count: int) -> list[str]:
    keys: dict[int, str] = {}
    number = 0
    while len(keys) < count:
        key = f"k{number}"
        keys.setdefault(lane_for(key, store.lanes), key)
        number += 1
    return list(keys.values())


async def relayed_in_transactions(store: StoreSettings, *, gap: float) -> tuple[int, int]:
    """Commit one row in each of three lanes, ``gap`` seconds apart, with a worker running;
    how many batch transactions it took and how many rows arrived."""
    memory = MemoryTransport("memory")
    worker = Worker([store], transports={store.name: {"memory": memory}})
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.started.wait(), 30)
        await asyncio.sleep(0.5)  # the first wake-up probe has found the empty outbox
        runtime = worker.runtimes[store.name]
        before = runtime.stats.batch_seconds.count
        outbox = Outbox(store)
        async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
            for key in keys_in_distinct_lanes(store, 3):
                await outbox.write_async(conn, destination="events", body=b"x", key=key)
                await conn.commit()
                await asyncio.sleep(gap)
        for _ in range(300):  # the stats are recorded once a batch's result is in
            if runtime.stats.sent == 3 and pending(store) == 0:
                break
            await asyncio.sleep(0.05)
        return runtime.stats.batch_seconds.count - before, len(memory.received("events"))
    finally:
        stop.set()
        await task


@pytest.mark.parametrize(("linger", "gap", "transactions"), [("400ms", 0.05, 1), ("0s", 0.3, 3)])
async def test_wake_ups_within_the_linger_share_one_transaction(
    pg_dsn: str, linger: str, gap: float, transactions: int
) -> None:
    store = make_store(
        pg_dsn,
        lanes=16,
        poll_interval="2s",
        lease_duration="10s",
        wake_linger=linger,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    used, received = await relayed_in_transactions(store, gap=gap)
    assert received == 3
    assert used == transactions
