"""A backlog spread over many lanes with a few rows each: one batch transaction takes many of
the due lanes (up to WIDE_BATCH_LANES), each read with a smaller limit, and each slot carries
a batch of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import psycopg

from relayer import Outbox
from relayer.relay.batch import WIDE_BATCH_LANES
from relayer.relay.grouping import SPREAD_LANES
from relayer.relay.results import ScanResult
from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import bodies_by_key, pending
from tests.integration.relay.test_wake_linger import keys_in_distinct_lanes

LANES = 1024
ROWS_PER_KEY = 3


async def backlog(pg_dsn: str, lease_duration: str, rows_per_key: int) -> StoreSettings:
    """A store of LANES lanes, batch_size 4, with ``rows_per_key`` rows in each lane (one key
    a lane; bodies KEY#N), committed."""
    store = make_store(
        pg_dsn,
        lanes=LANES,
        batch_size=4,
        lease_duration=lease_duration,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    keys = keys_in_distinct_lanes(store, LANES)
    outbox = Outbox(store)
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        for number in range(rows_per_key):
            for key in keys:
                await outbox.write_async(
                    conn, destination="events", body=f"{key}#{number}".encode(), key=key
                )
        await conn.commit()
    return store


async def test_a_backlog_over_many_lanes_goes_out_in_few_wide_transactions(pg_dsn: str) -> None:
    store = await backlog(pg_dsn, "20s", ROWS_PER_KEY)
    memory = MemoryTransport("memory")
    # Two slots: without wide batches at most two lanes would go per transaction.
    worker = Worker(
        [store],
        transports={store.name: {"memory": memory}},
        settings=WorkerSettings(pool_size=2),
    )
    runtime = worker.stores[store.name]
    sending = runtime.relay.batch.send_lanes
    sent_by_batch: list[int] = []  # rows each batch transaction sent, in the order they ended

    async def counted(conn: Any, lanes: Sequence[int]) -> list[ScanResult]:
        results = await sending(conn, lanes)
        sent_by_batch.append(sum(result.sent for result in results))
        return results

    runtime.relay.batch.send_lanes = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        schedule = runtime.relay.schedule

        def settled() -> bool:
            # Every row sent, and the lanes' last scans (below) have run: none is due or
            # running (each waits for the 20 s poll now).
            return (
                pending(store) == 0
                and schedule.due_count(schedule.now()) == 0
                and schedule.queue.running == 0
            )

        for _ in range(1200):
            if settled():
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    assert pending(store) == 0
    received = memory.received("events")
    assert len(received) == LANES * ROWS_PER_KEY
    # Each key's rows arrive once each, in the order they were written.
    assert all(
        bodies == list(range(ROWS_PER_KEY)) for bodies in bodies_by_key(received).values()
    ), "a key's rows went out of order or twice"
    # A wide batch of up to WIDE_BATCH_LANES lanes reads 16 x batch_size / its lanes = 1 row
    # per lane: 6 transactions for the 3,072 rows (6 measured); batches of the two slots' own
    # lanes took 538.
    with_rows = [sent for sent in sent_by_batch if sent]
    assert len(with_rows) <= 2 * ROWS_PER_KEY * LANES // WIDE_BATCH_LANES, sent_by_batch
    # A lane whose batch read as many rows as its limit is scanned again at once, and finds
    # nothing once the backlog is gone: each of those last batches takes at most half of the
    # lanes still due besides its own (512, 257, 128, ... lanes: 10 measured).
    empty = len(sent_by_batch) - len(with_rows)
    assert empty <= LANES.bit_length() + 1, sent_by_batch  # logarithmic in the lanes


async def test_a_backlog_over_more_lanes_than_a_batch_takes_keeps_a_batch_per_slot(
    pg_dsn: str,
) -> None:
    # A stalled batch waits up to half a lease (30 s) for its acknowledgements.
    store = await backlog(pg_dsn, "60s", 1)
    memory = MemoryTransport("memory")
    await memory.start()
    memory.stall()  # batches wait for their acknowledgements until resumed
    slots = 4 * SPREAD_LANES
    worker = Worker(
        [store],
        transports={store.name: {"memory": memory}},
        settings=WorkerSettings(pool_size=slots),
    )
    runtime = worker.stores[store.name]
    sending = runtime.relay.batch.send_lanes
    in_flight: list[int] = []  # the batches in flight, each time one starts
    running = ended = 0

    async def counted(conn: Any, lanes: Sequence[int]) -> list[ScanResult]:
        nonlocal running, ended
        running += 1
        in_flight.append(running)
        try:
            return await sending(conn, lanes)
        finally:
            running -= 1
            ended += 1

    runtime.relay.batch.send_lanes = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        for _ in range(1200):
            if running >= slots // SPREAD_LANES or ended:
                break
            await asyncio.sleep(0.05)
        # The first pass claimed a scan per slot; every SPREAD_LANES of them started a batch
        # of their own, widened, while the others stalled (one batch for them all would end
        # only at its deadline).
        assert running >= slots // SPREAD_LANES and not ended
        memory.resume()
        for _ in range(1200):
            if pending(store) == 0:
                break
            await asyncio.sleep(0.05)
    finally:
        memory.resume()
        stop.set()
        await task
    assert pending(store) == 0
    assert len(memory.received("events")) == LANES
    assert max(in_flight) <= slots  # never more batches than slots
