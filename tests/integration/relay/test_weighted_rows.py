"""Weights are honoured in rows (issue 34, item 24): stores with different batch sizes and lane
counts, served by one worker with too few slots for all their lanes, each get their weight's
share of the rows sent while every one of them has a backlog (the dispatch layer charges each
lane scan the rows its store sent)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable

import psycopg
import pytest

from relayer.dispatch import QueueControl
from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.base import OutgoingMessage
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import write
from tests.integration.relay.test_workers import BrokerView

# name: (weight, batch_size, lanes); each store's backlog is ROWS x its weight.
SHAPES = {"small": (1, 5, 4), "wide": (2, 40, 2), "many": (1, 10, 8)}
ROWS = 800
KEYS = [f"key-{number}" for number in range(16)]


class Recording(BrokerView):
    """The shared broker, and the order in which each store's rows reached it."""

    def __init__(self, broker: MemoryTransport, order: list[str]) -> None:
        super().__init__(broker)
        self.order = order

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        self.order.append(message.destination)
        return await self.broker.publish(message)


async def stores_of(dsn: str) -> list[StoreSettings]:
    stores = []
    for name, (_, batch_size, lanes) in SHAPES.items():
        store = make_store(
            dsn,
            name=name,
            table_prefix=f"{name}_",
            lanes=lanes,
            batch_size=batch_size,
            lease_duration="6s",
            poll_interval="0.2s",
            transports={"memory": {"type": "memory"}},
            default_transport="memory",
        )
        await apply_schema(store)
        stores.append(store)
    return stores


async def set_paused(stores: list[StoreSettings], paused: bool) -> None:
    for store in stores:
        async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
            control = QueueControl(conn, store.names)
            change = control.pause if paused else control.resume
            await change(store.name, reason="test", by="test")
            await conn.commit()


async def test_stores_get_their_weight_of_the_rows_whatever_their_batches_and_lanes(
    pg_dsn: str,
) -> None:
    stores = await stores_of(pg_dsn)
    weights = {name: weight for name, (weight, _, _) in SHAPES.items()}
    for store in stores:
        write(store, KEYS, per_key=ROWS * weights[store.name] // len(KEYS), destination=store.name)
    order: list[str] = []
    broker = MemoryTransport("memory")
    await set_paused(stores, True)  # all resumed at once once the worker serves them
    worker = Worker(
        stores,
        transports={store.name: {"memory": Recording(broker, order)} for store in stores},
        settings=WorkerSettings(pool_size=2, weights=weights),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    total = ROWS * sum(weights.values())
    try:
        await asyncio.wait_for(worker.started.wait(), 20)
        await set_paused(stores, False)
        async with asyncio.timeout(120):
            while len(order) < total:
                await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
    # The rows sent until the first store had sent all of its own: every store had a backlog.
    backlog = {name: ROWS * weight for name, weight in weights.items()}
    seen: Counter[str] = Counter()
    for destination in order:
        seen[destination] += 1
        if seen[destination] == backlog[destination]:
            break
    window = sum(seen.values())
    assert window >= total // 2, seen  # a long enough window to weigh
    for name, weight in weights.items():
        share = seen[name] / window
        assert share == pytest.approx(weight / sum(weights.values()), rel=0.05), seen
