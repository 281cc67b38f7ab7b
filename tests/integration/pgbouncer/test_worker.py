"""Workers and writers through PgBouncer in transaction mode, end to end: every row relayed,
per-key order kept, without LISTEN (polling) and with LISTEN on a direct ``listen_dsn``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from relayer import Outbox, OutboxMessage
from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.integration.pgbouncer.helpers import BOUNCERS, bouncer_of, pooled
from tests.integration.relay.helpers import first_deliveries_in_order, pending
from tests.integration.relay.test_workers import BrokerView, LaneWatch

KEYS = 60


@pytest.fixture(params=BOUNCERS)
def through(request: pytest.FixtureRequest, pg_dsn: str) -> Any:
    return bouncer_of(request)


def relayed_store(store: StoreSettings, through: Any, **overrides: Any) -> StoreSettings:
    return pooled(
        store,
        through,
        lease_duration="4s",
        poll_interval="0.2s",
        batch_size=50,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
        **overrides,
    )


@contextlib.asynccontextmanager
async def workers(
    store: StoreSettings, broker: MemoryTransport, count: int
) -> AsyncIterator[list[Worker]]:
    watch = LaneWatch()
    started: list[tuple[Worker, asyncio.Event, asyncio.Task[None]]] = []
    try:
        for number in range(count):
            worker = Worker(
                [store],
                transports={store.name: {"memory": BrokerView(broker)}},
                settings=WorkerSettings(pool_size=4),
                instance_id=f"worker-{number}",
            )
            worker.stores[store.name].relay.batch.observer = watch.observer(worker.member)
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run(stop))
            started.append((worker, stop, task))
            await asyncio.wait_for(worker.started.wait(), 15)
        yield [worker for worker, _, _ in started]
    finally:
        for _, stop, _ in started:
            stop.set()
        for _, _, task in started:
            await asyncio.wait_for(task, 20)
    assert watch.violations == []
    for worker, _, _ in started:  # nothing failed: no rollback, no scan that could not run
        stats = worker.stores[store.name].relay.stats
        assert (stats.rollbacks, stats.last_error) == (0, "")


async def write_from_clients(store: StoreSettings, clients: int, transactions: int) -> list[Any]:
    """Rows for random keys from ``clients`` connections, interleaved, ten per transaction."""
    outbox, rng, ids = Outbox(store), random.Random(5), []
    conns = [await psycopg.AsyncConnection.connect(store.require_dsn()) for _ in range(clients)]
    try:
        for number in range(transactions):
            conn = conns[number % clients]
            messages = [
                OutboxMessage("events", f"{number}.{row}".encode(), key=f"k{rng.randrange(KEYS)}")
                for row in range(10)
            ]
            ids.extend(await outbox.write_many_async(conn, messages))
            await conn.commit()
    finally:
        for conn in conns:
            await conn.close()
    return ids


async def drained(store: StoreSettings, timeout: float = 60) -> None:
    """Until ``store`` (read directly: a blocking read through the pool could wait for a
    server connection that a worker of this event loop holds) has no row left."""
    deadline = time.monotonic() + timeout
    while pending(store) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert pending(store) == 0


async def test_workers_poll_without_listen(
    store: StoreSettings, through: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pooled_store = relayed_store(store, through)
    broker = MemoryTransport("memory")
    woken: list[str] = []
    caplog.set_level(logging.INFO, logger="relayer.relay")
    async with workers(pooled_store, broker, 2) as running:
        for worker in running:
            wakeups = worker.stores[pooled_store.name].relay.wakeups
            wakeups.woken = woken.append  # type: ignore[method-assign]
        written = await write_from_clients(pooled_store, 6, 60)
        await drained(store)
    received = broker.received("events")
    assert {message.id for message in received} >= set(written)
    assert first_deliveries_in_order(received)
    assert woken == []  # no notification reached a worker: each polled
    quiet = [r for r in caplog.records if getattr(r, "action", None) == "listen_off"]
    assert len(quiet) == 2  # once per worker
    assert "set listen_dsn" in quiet[0].getMessage()
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_listen_on_a_direct_listen_dsn(
    store: StoreSettings, through: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pooled_store = relayed_store(store, through, listen_dsn=store.require_dsn())
    broker = MemoryTransport("memory")
    woken: list[str] = []
    caplog.set_level(logging.INFO, logger="relayer.relay")
    async with workers(pooled_store, broker, 1) as [worker]:
        wakeups = worker.stores[pooled_store.name].relay.wakeups
        wake = wakeups.woken

        def record(payload: str) -> None:
            woken.append(payload)
            wake(payload)

        wakeups.woken = record  # type: ignore[method-assign]
        written = await write_from_clients(pooled_store, 3, 30)
        await drained(store)
    assert {message.id for message in broker.received("events")} >= set(written)
    assert woken  # writers' NOTIFY (sent through PgBouncer) reached the direct LISTEN
    assert not [r for r in caplog.records if getattr(r, "action", None) == "listen_off"]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
