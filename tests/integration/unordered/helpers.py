"""Helpers for the unordered tests: a store with a memory transport, outbox rows by id."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

import psycopg

from relayer.settings import StoreSettings, WorkerSettings
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store


async def memory_store(dsn: str, **overrides: Any) -> StoreSettings:
    values: dict[str, Any] = {
        "transports": {"memory": {"type": "memory"}},
        "default_transport": "memory",
        "retry_backoff": "0.5s",
        "retry_backoff_max": "1h",
    }
    values.update(overrides)
    store = make_store(dsn, **values)
    await apply_schema(store)
    return store


def rows(store: StoreSettings) -> dict[UUID, tuple[Any, ...]]:
    """id -> (attempts, last_error, seconds until deliver_at or None) of every outbox row."""
    with psycopg.connect(store.require_dsn()) as conn:
        found = conn.execute(
            f"SELECT id, attempts, last_error, extract(epoch FROM deliver_at - now())::float8 "
            f"FROM {store.table_prefix}outbox"
        ).fetchall()
    return {row[0]: tuple(row[1:]) for row in found}


def backdate(store: StoreSettings, ids: Sequence[UUID], seconds: float = 3600) -> None:
    """Make rows look written ``seconds`` ago (an application that died long ago)."""
    with psycopg.connect(store.require_dsn()) as conn:
        conn.execute(
            f"UPDATE {store.table_prefix}outbox "
            "SET created_at = now() - make_interval(secs => %s) WHERE id = ANY(%s)",
            (seconds, list(ids)),
        )
        conn.commit()


async def run_worker_until(
    store: StoreSettings, done: Callable[[], bool], timeout: float = 30, pool_size: int = 2
) -> Worker:
    """Run a worker over ``store`` (transports from its settings) until ``done()``."""
    worker = Worker([store], settings=WorkerSettings(pool_size=pool_size))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        async with asyncio.timeout(timeout):
            while not done():
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    return worker
