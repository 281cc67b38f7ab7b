"""Wake-ups that arrive within ``wake_linger`` are served together: one batch transaction."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from relayer import Outbox, lane_for
from relayer.dispatch.cluster import ClaimRequest, ClaimResult
from relayer.relay.results import ScanResult
from relayer.settings import StoreSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.dispatch.helpers import relayer_cli
from tests.integration.relay.helpers import pending


def keys_in_distinct_lanes(store: StoreSettings, count: int) -> list[str]:
    keys: dict[int, str] = {}
    number = 0
    while len(keys) < count:
        key = f"k{number}"
        keys.setdefault(lane_for(key, store.lanes), key)
        number += 1
    return list(keys.values())


async def sent_all(served: Any, store: StoreSettings, rows: int) -> None:
    """Wait (up to 15 s) until the worker has counted ``rows`` sent and the outbox is empty (the
    stats are recorded once a batch's result is in)."""
    for _ in range(300):
        if served.relay.stats.sent == rows and pending(store) == 0:
            return
        await asyncio.sleep(0.05)


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
        runtime = worker.stores[store.name]
        before = runtime.relay.stats.batch_seconds.count
        outbox = Outbox(store)
        async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
            for key in keys_in_distinct_lanes(store, 3):
                await outbox.write_async(conn, destination="events", body=b"x", key=key)
                await conn.commit()
                await asyncio.sleep(gap)
        await sent_all(runtime, store, 3)
        return runtime.relay.stats.batch_seconds.count - before, len(memory.received("events"))
    finally:
        stop.set()
        await task


async def linger_store(pg_dsn: str, linger: str) -> StoreSettings:
    """A store of 16 lanes relaying to a memory transport, ``wake_linger=linger``; schema
    applied."""
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
    return store


@pytest.mark.parametrize(("linger", "gap", "transactions"), [("400ms", 0.05, 1), ("0s", 0.3, 3)])
async def test_wake_ups_within_the_linger_share_one_transaction(
    pg_dsn: str, linger: str, gap: float, transactions: int
) -> None:
    store = await linger_store(pg_dsn, linger)
    used, received = await relayed_in_transactions(store, gap=gap)
    assert received == 3
    assert used == transactions


async def memory_worker(pg_dsn: str, linger: str) -> tuple[StoreSettings, MemoryTransport, Worker]:
    """A linger_store and a worker relaying it to a memory transport (not started)."""
    store = await linger_store(pg_dsn, linger)
    memory = MemoryTransport("memory")
    return store, memory, Worker([store], transports={store.name: {"memory": memory}})


async def test_a_window_is_claimed_as_it_opens_and_its_lanes_ride_on_that_slot(
    pg_dsn: str,
) -> None:
    """The lane that opens a window has its dispatch claim made at once (its round trip
    overlaps the linger); the lanes woken later in the window go in its batch at the window's
    end, on the one slot it was granted."""
    store, memory, worker = await memory_worker(pg_dsn, "1s")
    runtime = worker.stores[store.name]
    assert runtime.gate is not None
    claims: list[tuple[float, int]] = []  # when a claim granted slots, and how many
    acquire = runtime.gate.acquire

    async def recorded_acquire(request: ClaimRequest) -> ClaimResult:
        result = await acquire(request)
        if result.grants:
            claims.append((time.monotonic(), len(result.grants)))
        return result

    batches: list[tuple[float, list[int]]] = []
    send_lanes = runtime.relay.batch.send_lanes

    async def recorded_send_lanes(conn: Any, lanes: Sequence[int]) -> list[ScanResult]:
        batches.append((time.monotonic(), list(lanes)))
        return await send_lanes(conn, lanes)

    runtime.gate.acquire = recorded_acquire  # type: ignore[method-assign]
    runtime.relay.batch.send_lanes = recorded_send_lanes  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.started.wait(), 30)
        await asyncio.sleep(0.5)  # the first wake-up probe has found the empty outbox
        claims.clear()
        outbox = Outbox(store)
        keys = keys_in_distinct_lanes(store, 3)
        committed: list[float] = []
        async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
            for key in keys:
                await outbox.write_async(conn, destination="events", body=b"x", key=key)
                await conn.commit()
                committed.append(time.monotonic())
                await asyncio.sleep(0.25)
        await sent_all(runtime, store, 3)
    finally:
        stop.set()
        await task
    assert len(memory.received("events")) == 3
    assert pending(store) == 0
    lanes = sorted(lane_for(key, store.lanes) for key in keys)
    assert [lanes_sent for _, lanes_sent in batches] == [lanes]
    # One claim, of one slot, made while the window was still gathering lanes (before the
    # last write, a second before the window ends), and nothing else claimed for them.
    assert [slots for _, slots in claims] == [1], claims
    assert claims[0][0] < committed[-1] < batches[0][0]


async def test_a_paused_store_sends_no_window_and_every_lane_of_it_goes_once_resumed(
    pg_dsn: str,
) -> None:
    """The opener's claim is refused while the store is paused: neither it nor the lanes that
    joined its window are sent, and all of them go once the store is resumed."""
    store, memory, worker = await memory_worker(pg_dsn, "200ms")
    runtime = worker.stores[store.name]
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.started.wait(), 30)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(relayer_cli, store, "queue", "pause", store.name, "--by", "t")
        outbox = Outbox(store)
        async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
            for key in keys_in_distinct_lanes(store, 3):
                await outbox.write_async(conn, destination="events", body=b"x", key=key)
                await conn.commit()
                await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # past the window, its joiners' own due time and a recheck
        assert memory.received("events") == []
        assert runtime.relay.stats.batch_seconds.count == 0
        await asyncio.to_thread(relayer_cli, store, "queue", "resume", store.name, "--by", "t")
        await sent_all(runtime, store, 3)
    finally:
        stop.set()
        await task
    assert len(memory.received("events")) == 3
    assert pending(store) == 0
