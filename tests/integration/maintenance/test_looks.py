"""Maintenance looks on the housekeeping connection: an idle store's recovery and cleanup cost
no dispatch job; a look that finds work schedules the job, which does it."""

from __future__ import annotations

import asyncio

import psycopg

from relayer import Outbox, OutboxMessage
from relayer.settings import StoreSettings, WorkerSettings
from relayer.store.maintenance import read_health_and_retention
from relayer.worker import Worker
from relayer.worker.maintenance import Task, maintenance_queue
from tests.integration.maintenance.test_retention import claim_messages, execute
from tests.integration.unordered.helpers import backdate, memory_store, run_worker_until


def maintenance_jobs(worker: Worker, store: StoreSettings) -> int:
    queue = maintenance_queue(store.name)
    return next(t.served for t in worker.group.telemetry() if t.queue == queue)


async def retention_due(store: StoreSettings) -> bool:
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        _, due = await read_health_and_retention(conn, store)
    return due


async def test_an_idle_store_looks_and_runs_no_maintenance_job(pg_dsn: str) -> None:
    store = await memory_store(pg_dsn, maintenance_interval="0.05s", cleanup_interval="0.05s")
    worker = Worker([store], settings=WorkerSettings(pool_size=2))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    planned: set[float] = set()
    try:
        async with asyncio.timeout(30):
            await worker.started.wait()
            maintenance = worker.stores[store.name].maintenance
            while len(planned) < 3:  # three cleanup looks, each planning the next
                if maintenance.last_health is not None:
                    planned.add(maintenance.planned_looks.get(Task.CLEANUP, 0.0))
                await asyncio.sleep(0.01)
    finally:
        stop.set()
        await task
    assert maintenance.last_health is not None and maintenance.last_health.warnings == ()
    assert maintenance_jobs(worker, store) == 0


async def test_a_look_that_finds_work_runs_the_job(pg_dsn: str) -> None:
    store = await memory_store(pg_dsn, maintenance_interval="0.05s", cleanup_interval="0.05s")
    claim_messages(store, 1)
    execute(store, "UPDATE {p}inbox SET received_at = now() - interval '30 days'")
    with psycopg.connect(store.require_dsn()) as conn:
        [row] = Outbox(store).write_many(conn, [OutboxMessage("events", b"x")])
        conn.commit()
    backdate(store, [row])  # unordered, past its grace: recovery sends it
    assert await retention_due(store)
    worker = await run_worker_until(
        store,
        lambda: not execute(store, "SELECT 1 FROM {p}inbox UNION ALL SELECT 1 FROM {p}outbox"),
    )
    assert maintenance_jobs(worker, store) >= 2  # the recovery and the cleanup
    assert worker.stores[store.name].maintenance.recovered == 1
    assert not await retention_due(store)
