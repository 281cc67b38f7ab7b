"""``relayer run``, ``relayer status`` and ``relayer parked`` as an operator uses them."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import psycopg
import pytest

from relayer.ids import uuid7
from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.acceptance.cli import command, environment, relayer
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import bodies_by_key, keys_in_lane, parked, pending, write


@pytest.fixture
async def memory_store(pg_dsn: str) -> StoreSettings:
    return await memory_store_of(pg_dsn, "delete")


@pytest.fixture(params=["delete", "partitioned"])
async def either_store(pg_dsn: str, request: pytest.FixtureRequest) -> StoreSettings:
    """memory_store, of each storage mode (docs/storage.md)."""
    return await memory_store_of(pg_dsn, request.param)


async def memory_store_of(pg_dsn: str, storage: str) -> StoreSettings:
    store = make_store(
        pg_dsn,
        storage=storage,
        lanes=8,
        lease_duration="3s",
        poll_interval="0.1s",
        max_attempts=1,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    return store


def worker_env(store: StoreSettings) -> dict[str, str]:
    return environment(
        store,
        RELAYER_STORES__ORDERS__LEASE_DURATION="3s",
        RELAYER_STORES__ORDERS__POLL_INTERVAL="0.1s",
        RELAYER_STORES__ORDERS__MAX_ATTEMPTS="1",
        RELAYER_STORES__ORDERS__TRANSPORTS__MEMORY__TYPE="memory",
        RELAYER_STORES__ORDERS__DEFAULT_TRANSPORT="memory",
        RELAYER_WORKER__POOL_SIZE="4",
        RELAYER_STORES__ORDERS__STORAGE=store.storage,
    )


def wait_until(predicate: object, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"not true within {within} s")


def test_run_relays_until_sigterm_then_leaves(memory_store: StoreSettings) -> None:
    keys = [f"key-{index}" for index in range(50)]
    write(memory_store, keys, per_key=4)
    process = subprocess.Popen(
        command("run", "orders"),
        env=worker_env(memory_store),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: pending(memory_store) == 0, 30)
        status = relayer("status", "orders", env=worker_env(memory_store))
        assert status.returncode == 0, status.stderr
        assert "members (1):" in status.stdout
        assert "pending: 0 rows" in status.stdout
        write(memory_store, keys[:5])  # woken by NOTIFY (or the poll)
        wait_until(lambda: pending(memory_store) == 0, 10)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    status = relayer("status", "orders", env=worker_env(memory_store))
    assert "members (0):" in status.stdout
    assert "lanes owned: 0 (0 leased now), not owned: 8" in status.stdout


def test_a_store_without_default_transport_is_warned_about_once_started(
    memory_store: StoreSettings,
) -> None:
    env = worker_env(memory_store)
    del env["RELAYER_STORES__ORDERS__DEFAULT_TRANSPORT"]
    write(memory_store, ["key-1"], transport="memory")
    process = subprocess.Popen(command("run", "orders"), env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: pending(memory_store) == 0, 30)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    warnings = [line for line in stderr.splitlines() if "no_default_transport" in line]
    assert len(warnings) == 1, stderr
    assert (
        "WARNING relayer.cli.run_command: store orders has no default_transport: rows that name "
        "no transport will be parked until it is set; set stores.orders.default_transport, or "
        "pass transport=... to every write [action=no_default_transport store=orders]"
    ) in warnings[0]


def test_duplicate_store_names_are_refused(memory_store: StoreSettings) -> None:
    result = relayer("run", "orders", "orders", env=worker_env(memory_store))
    assert result.returncode == 2
    assert "case-sensitive and unique" in result.stderr


def test_unknown_transport_parks_only_its_key_and_can_be_dropped(
    either_store: StoreSettings,
) -> None:
    memory_store = either_store
    bad, good = keys_in_lane(memory_store, 3, 2)
    with psycopg.connect(memory_store.require_dsn(), autocommit=True) as conn:
        for _ in range(3):
            conn.execute(
                "INSERT INTO orders_outbox (id, lane, ordering_key, transport, destination, body) "
                "VALUES (%s, 3, %s, 'sqs', 'events', 'x')",
                (uuid7(), bad),  # a UUIDv7, as relayer's writers make (a partition bound)
            )
    write(memory_store, [good], per_key=3)
    process = subprocess.Popen(
        command("run", "orders"), env=worker_env(memory_store), stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(lambda: pending(memory_store) == 3 and bad in parked(memory_store), 30)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    listed = relayer("parked", "list", "orders", env=worker_env(memory_store))
    assert listed.returncode == 0
    assert f"{bad!r}: lane 3, 3 pending row(s)" in listed.stdout
    assert "transport 'sqs' is not configured" in listed.stdout
    assert "waiting for an operator" in listed.stdout
    refused = relayer("parked", "drop", "orders", env=worker_env(memory_store))
    assert refused.returncode == 2
    dropped = relayer("parked", "drop", "orders", "--key", bad, env=worker_env(memory_store))
    assert dropped.returncode == 0
    assert f"dropped {bad!r}: 3 row(s) deleted" in dropped.stdout
    assert pending(memory_store) == 0
    assert parked(memory_store) == {}


async def test_redrive_delivers_the_rest_of_the_key_in_order(either_store: StoreSettings) -> None:
    memory_store = either_store
    bad, good = keys_in_lane(memory_store, 5, 2)
    broker = MemoryTransport("memory")
    broker.fail_key(bad, message="consumer rejected the schema")
    worker = Worker(
        [memory_store],
        transports={"orders": {"memory": broker}},
        settings=WorkerSettings(pool_size=4),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        write(memory_store, [bad, good], per_key=5)
        async with asyncio.timeout(20):
            while bad not in parked(memory_store) or pending(memory_store) != 5:
                await asyncio.sleep(0.05)
        assert bodies_by_key(broker.received("events")) == {good: [0, 1, 2, 3, 4]}
        write(memory_store, [bad], per_key=1)  # a sixth row of the parked key waits too
        broker.clear_key(bad)
        redriven = await asyncio.to_thread(
            relayer, "parked", "redrive", "orders", "--key", bad, env=worker_env(memory_store)
        )
        assert redriven.returncode == 0, redriven.stderr
        assert f"redriven {bad!r}: 6 row(s)" in redriven.stdout
        async with asyncio.timeout(20):
            while pending(memory_store):
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    received = bodies_by_key(broker.received("events"))
    assert received[bad] == [0, 1, 2, 3, 4, 0]  # "#0" of the second write is the sixth row
    assert parked(memory_store) == {}


async def test_queue_pause_stops_a_running_worker_and_resume_restores_it(
    memory_store: StoreSettings,
) -> None:
    broker = MemoryTransport("memory")
    worker = Worker(
        [memory_store],
        transports={"orders": {"memory": broker}},
        settings=WorkerSettings(pool_size=4),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    env = worker_env(memory_store)
    try:
        await asyncio.wait_for(worker.started.wait(), 10)
        paused = await asyncio.to_thread(relayer, "queue", "pause", "orders", env=env)
        assert paused.returncode == 0, paused.stderr
        write(memory_store, [f"key-{index}" for index in range(20)])
        await asyncio.sleep(1.0)  # ten poll intervals, and the writer's NOTIFY
        assert pending(memory_store) == 20
        resumed = await asyncio.to_thread(relayer, "queue", "resume", "orders", env=env)
        assert resumed.returncode == 0, resumed.stderr
        async with asyncio.timeout(10):
            while pending(memory_store):
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    assert len(broker.received("events")) == 20
