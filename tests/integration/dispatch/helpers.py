"""Shared pieces of the PostgreSQL dispatch tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from relayer.dispatch import PostgresClusterState
from relayer.dispatch.control import queue_lock_key
from relayer.settings import StoreSettings
from relayer.store import wire

ROOT = Path(__file__).resolve().parents[3]


class CountingConnection(psycopg.AsyncConnection[Any]):
    """Counts the round trips made on it, to prove what a pass costs: each statement psycopg
    runs, and each pipeline of relayer.store.wire once ``count_wire`` is in place."""

    statements = 0

    async def execute(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        type(self).statements += 1
        return await super().execute(*args, **kwargs)


def count_wire(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count relayer.store.wire's pipelines on CountingConnections too."""
    run = wire.run

    async def counted(conn: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(conn, CountingConnection):
            CountingConnection.statements += 1
        return await run(conn, *args, **kwargs)

    monkeypatch.setattr(wire, "run", counted)


async def slots_in_use(store: StoreSettings, queue: str, pid: int | None = None) -> int:
    """Slot locks of ``queue`` held right now, counted by PostgreSQL (optionally one backend)."""
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        cursor = await conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 "
            "AND granted AND classid::bigint = %s AND (%s::int IS NULL OR pid = %s::int) "
            # Another test's store in another database may share the schema, prefix and queue
            # name, and so the lock key: only this database's locks are this store's.
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (queue_lock_key(store.names, queue), pid, pid),
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def server_pid(state: PostgresClusterState) -> int:
    """The server process of a gate's dispatcher connection, asked on it (a pooler's fake
    BackendKeyData pid is not one; while the gate holds a slot behind a transaction pooler, its
    transaction keeps that server process)."""
    conn = state._shared.conn
    assert conn is not None
    cursor = await conn.execute("SELECT pg_backend_pid()")
    row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def wait_for_backend_exit(store: StoreSettings, pid: int) -> None:
    """Until PostgreSQL has ended backend ``pid`` (its locks go with it)."""
    async with (
        await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn,
        asyncio.timeout(10),
    ):
        while True:
            cursor = await conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
            if await cursor.fetchone() is None:
                return
            await asyncio.sleep(0.01)


def start_worker(*arguments: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.dispatch.limit_worker", *arguments],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def read_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    async with asyncio.timeout(15):
        line = await asyncio.to_thread(process.stdout.readline)
    assert line, f"worker exited with {process.wait()}"
    return line.strip()


def relayer_cli(
    store: StoreSettings, *arguments: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``python -m relayer ARGUMENTS`` with ``store`` configured through the environment only."""
    prefix = f"RELAYER_STORES__{store.name.upper()}__"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("RELAYER_") or key.startswith("RELAYER_TEST_")
    }
    env.update(
        {
            prefix + "DSN": store.require_dsn(),
            prefix + "TABLE_PREFIX": store.table_prefix,
            prefix + "LANES": str(store.lanes),
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "relayer", *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )
