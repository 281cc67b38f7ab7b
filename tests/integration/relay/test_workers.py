"""Several workers in one event loop over one store: the protocol's invariants end to end."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import psycopg
import pytest

from relayer import Outbox, OutboxMessage, lane_for
from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.base import OutgoingMessage, Transport
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import first_deliveries_in_order, pending

LEASE = 3.0


class BrokerView:
    """One worker's handle on the shared broker: closing it does not close the broker."""

    def __init__(self, broker: MemoryTransport) -> None:
        self.broker = broker

    @property
    def name(self) -> str:
        return self.broker.name

    @property
    def pipelines_within_key(self) -> bool:
        return self.broker.pipelines_within_key

    async def start(self) -> None:
        if not self.broker.started:
            await self.broker.start()

    async def ordered_by_key(self, destination: str) -> bool:
        return await self.broker.ordered_by_key(destination)

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        return await self.broker.publish(message)

    async def close(self) -> None:
        return None


class LaneWatch:
    """Fails the test if two members are ever inside a lane's send window at once."""

    def __init__(self) -> None:
        self.active: dict[int, str] = {}
        self.violations: list[str] = []

    def observer(self, member: str) -> Any:
        def observe(lane: int, entering: bool) -> None:
            holder = self.active.get(lane)
            if entering:
                if holder is not None and holder != member:
                    self.violations.append(f"lane {lane}: {member} entered while {holder} sends")
                self.active[lane] = member
            elif holder == member:
                del self.active[lane]

        return observe


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    settings = make_store(
        pg_dsn,
        lanes=16,
        batch_size=200,
        lease_duration=f"{LEASE}s",
        poll_interval="0.1s",
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(settings)
    return settings


@contextlib.asynccontextmanager
async def running(
    store: StoreSettings, broker: MemoryTransport, watch: LaneWatch, name: str
) -> AsyncIterator[tuple[Worker, asyncio.Event, asyncio.Task[None]]]:
    view: Transport = BrokerView(broker)
    worker = Worker(
        [store],
        transports={store.name: {"memory": view}},
        settings=WorkerSettings(pool_size=6),
        instance_id=name,
    )
    worker.stores[store.name].relay.batch.observer = watch.observer(name)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await asyncio.wait_for(worker.started.wait(), 10)
    try:
        yield worker, stop, task
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def write_steadily(
    store: StoreSettings, rows: int, keys: int, per_transaction: int
) -> list[Any]:
    outbox = Outbox(store)
    rng = random.Random(3)
    ids: list[Any] = []
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        for start in range(0, rows, per_transaction):
            messages = [
                OutboxMessage("events", f"{index}".encode(), key=f"key-{rng.randrange(keys)}")
                for index in range(start, min(rows, start + per_transaction))
            ]
            ids.extend(await outbox.write_many_async(conn, messages))
            await conn.commit()
            await asyncio.sleep(0)
    return ids


async def drained(store: StoreSettings, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while pending(store) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


async def test_three_workers_relay_everything_in_order(store: StoreSettings) -> None:
    broker = MemoryTransport("memory")
    watch = LaneWatch()
    async with (
        running(store, broker, watch, "worker-a") as (a, _, _),
        running(store, broker, watch, "worker-b") as (b, _, _),
        running(store, broker, watch, "worker-c") as (c, _, _),
    ):
        written = await write_steadily(store, 20_000, 500, 250)
        await drained(store, 60)
        # The rows can drain before the last worker to join is in every member's view (a
        # heartbeat every lease / 3): give the membership a few heartbeats to settle.
        deadline = time.monotonic() + 3 * LEASE
        while True:
            shares = [len(worker.lanes[store.name]) for worker in (a, b, c)]
            if sum(shares) == store.lanes or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    assert pending(store) == 0  # I4
    received = broker.received("events")
    assert {message.id for message in received} >= set(written)  # I1
    assert first_deliveries_in_order(received)  # I2
    assert sum(shares) == store.lanes and max(shares) - min(shares) <= 1
    assert watch.violations == []
    duplicates = len(received) - len({message.id for message in received})
    assert duplicates == 0  # no fault injected: nothing is sent twice
    keys = {message.key for message in received}
    assert len(keys) == 500
    assert all(lane_for(key, store.lanes) < store.lanes for key in keys if key)


async def lane_owners(store: StoreSettings) -> dict[int, str]:
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        cursor = await conn.execute(
            "SELECT lane, owner FROM orders_leases WHERE lane IS NOT NULL AND expires_at > now()"
        )
        return {int(lane): str(owner) for lane, owner in await cursor.fetchall()}


async def wait_for_owners(store: StoreSettings, workers: list[Worker], timeout: float) -> float:
    """Seconds until every lane is leased by the worker whose share holds it."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        expected = {lane: worker.member for worker in workers for lane in worker.lanes[store.name]}
        if len(expected) == store.lanes and await lane_owners(store) == expected:
            return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise AssertionError(f"lanes not rebalanced within {timeout} s: {await lane_owners(store)}")


async def keep_writing(store: StoreSettings, stop: asyncio.Event) -> int:
    outbox = Outbox(store)
    written = 0
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        while not stop.is_set():
            messages = [OutboxMessage("events", b"x", key=f"key-{index}") for index in range(64)]
            written += len(await outbox.write_many_async(conn, messages))
            await conn.commit()
            await asyncio.sleep(0.02)
    return written


async def test_joining_and_leaving_rebalance_within_lease_and_a_third(
    store: StoreSettings,
) -> None:
    broker = MemoryTransport("memory")
    watch = LaneWatch()
    limit = LEASE + LEASE / 3
    stop_writing = asyncio.Event()
    writer = asyncio.create_task(keep_writing(store, stop_writing))
    async with (
        running(store, broker, watch, "worker-a") as (a, _, _),
        running(store, broker, watch, "worker-b") as (b, _, _),
    ):
        await wait_for_owners(store, [a, b], limit + 2)
        async with running(store, broker, watch, "worker-c") as (c, stop_c, task_c):
            joined = await wait_for_owners(store, [a, b, c], limit + 2)
            stop_c.set()
            await asyncio.wait_for(task_c, 10)
            left = await wait_for_owners(store, [a, b], limit + 2)
        stop_writing.set()
        await writer
        await drained(store, 30)
    assert joined <= limit, joined
    assert left <= limit, left
    assert watch.violations == []
    assert pending(store) == 0
    assert first_deliveries_in_order(broker.received("events"))
