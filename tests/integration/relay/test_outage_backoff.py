"""While the broker cannot be used, writers' notifications do not make the worker retry faster
than ``retry_backoff``: an outage costs one attempt per lane per backoff, however fast rows are
written, and nothing is counted against the rows."""

from __future__ import annotations

import asyncio
import time

import psycopg

from relayer import Outbox
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import first_deliveries_in_order, parked, pending
from tests.integration.relay.test_wake_linger import keys_in_distinct_lanes

LANES_WRITTEN = 4
BACKOFF = 1.0


async def test_notifications_during_an_outage_wait_for_the_backoff(pg_dsn: str) -> None:
    store = make_store(
        pg_dsn,
        lanes=16,
        poll_interval="5s",
        lease_duration="20s",
        retry_backoff=f"{BACKOFF}s",
        wake_linger="0s",
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    memory = MemoryTransport("memory")
    memory.disconnect("the broker is down")
    worker = Worker([store], transports={store.name: {"memory": memory}})
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    keys = keys_in_distinct_lanes(store, LANES_WRITTEN)
    try:
        await asyncio.wait_for(worker.started.wait(), 30)
        runtime = worker.stores[store.name]
        outbox = Outbox(store)
        started = time.monotonic()
        async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
            for number in range(60):  # one transaction, so one NOTIFY, per row
                await outbox.write_async(
                    conn, destination="events", body=str(number).encode(), key=keys[number % 4]
                )
                await conn.commit()
                await asyncio.sleep(0.04)
        elapsed = time.monotonic() - started
        attempts = runtime.relay.stats.by_scan.get("unavailable", 0)
        assert attempts >= LANES_WRITTEN  # every lane tried, and found the broker down
        # At most one attempt per lane per backoff (and the first), not one per notification.
        assert attempts <= LANES_WRITTEN * (int(elapsed / BACKOFF) + 2), (attempts, elapsed)
        memory.reconnect()
        for _ in range(200):
            if pending(store) == 0:
                break
            await asyncio.sleep(0.05)
        assert pending(store) == 0 and not parked(store)
        assert len(memory.received("events")) >= 60
        assert first_deliveries_in_order(memory.received("events"))
    finally:
        stop.set()
        await task
