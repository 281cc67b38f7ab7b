"""The store gateway on real PostgreSQL: a backend killed under each path the relay uses
surfaces as StoreError (never a driver error), with the driver's error chained, and the next
use reconnects."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psycopg
import pytest

from relayer.errors import StoreError
from relayer.relay.membership import Membership
from relayer.relay.probes import Prober
from relayer.relay.unordered import UnorderedSender
from relayer.settings import StoreSettings
from relayer.store import RelayStore, Session, StorePool, UnorderedStore, listen
from relayer.transports.memory import MemoryTransport
from relayer.transports.routing import Routing
from relayer.worker import Worker
from relayer.worker.maintenance import Maintenance, Task, cleanup
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import pending, write


def terminate(store: StoreSettings, *, pid: int | None = None, application: str = "") -> int:
    """Kill the backends of ``store``'s database with this pid or application_name; waits
    until they are gone. Returns how many."""
    with psycopg.connect(store.require_dsn(), autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_catalog.pg_terminate_backend(pid, 10000) FROM pg_catalog.pg_stat_activity "
            "WHERE datname = pg_catalog.current_database() AND pid <> pg_catalog.pg_backend_pid() "
            "AND (pid = %s OR application_name = %s)",
            (pid, application),
        ).fetchall()
    return len(rows)


def assert_translated(error: StoreError, doing: str) -> None:
    assert not isinstance(error, psycopg.Error)
    assert isinstance(error.__cause__, psycopg.Error)
    assert f"store 'orders': {doing} failed" in str(error)


async def test_a_killed_heartbeat_connection_is_a_store_error_and_the_next_beat_reconnects(
    store: StoreSettings,
) -> None:
    membership = Membership(store, "member-a")
    await membership.beat()
    assert terminate(store, pid=membership.session.backend_pid) == 1
    with pytest.raises(StoreError) as raised:
        await membership.beat()
    assert_translated(raised.value, "heartbeat")
    await membership.beat()
    assert membership.members == ("member-a",)
    assert terminate(store, pid=membership.session.backend_pid) == 1
    await membership.leave()  # logs the failure, never raises
    assert membership.lanes == frozenset()


async def test_a_killed_probe_connection_is_a_store_error_and_the_next_probe_reconnects(
    store: StoreSettings,
) -> None:
    prober = Prober(RelayStore(store))
    try:
        assert await prober.heads(0, 1) == []
        assert terminate(store, pid=prober.session.backend_pid) == 1
        with pytest.raises(StoreError) as raised:
            await prober.head(3)
        assert_translated(raised.value, "probe lanes")
        assert not (await prober.head(3)).has_head
    finally:
        await prober.close()


async def test_a_killed_listen_connection_is_a_store_error(store: StoreSettings) -> None:
    async with listen(store) as notifications:
        with psycopg.connect(store.require_dsn(), autocommit=True) as writer:
            writer.execute("SELECT pg_catalog.pg_notify(%s, '7')", (store.names.notify_channel,))
        assert await notifications.next(5) == ["7"]
        assert terminate(store, application="relayer:orders:listen") == 1
        with pytest.raises(StoreError) as raised:
            await notifications.next(5)
    assert_translated(raised.value, "LISTEN")


async def test_a_killed_connection_during_unordered_recovery_is_a_store_error(
    store: StoreSettings,
) -> None:
    pool = StorePool(store, purpose="batch", max_size=1)
    await pool.open()
    try:
        async with pool.connection() as conn:
            pid = conn.info.backend_pid
            assert terminate(store, pid=pid) == 1
            with pytest.raises(StoreError) as raised:
                await UnorderedStore(store).claim_due(conn, 10)
        assert_translated(raised.value, "claim unordered rows")
        # The sender never raises for it: the pass reports the error, the rows stay.
        async with pool.connection() as conn:
            assert terminate(store, pid=conn.info.backend_pid) == 1
            result = await UnorderedSender(store, Routing(store, {})).recover(conn, 10)
        assert "claim unordered rows failed" in result.error
        # And the maintenance task retries after retry_backoff (not maintenance_interval).
        maintenance = Maintenance(store, {}, pool, lambda: 0.0, leader=lambda: True)
        async with pool.connection() as conn:
            assert terminate(store, pid=conn.info.backend_pid) == 1
        await maintenance.run(Task.RECOVER_UNORDERED)
        assert maintenance.queue.next_due() == store.retry_backoff.total_seconds()
        assert store.retry_backoff != store.maintenance_interval
    finally:
        await pool.close()


async def test_a_killed_connection_during_cleanup_is_a_store_error(store: StoreSettings) -> None:
    assert store.inbox_retention is not None
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        assert (await cleanup(conn, store)).skipped is False
        assert terminate(store, pid=conn.info.backend_pid) == 1
        with pytest.raises(StoreError) as raised:
            await cleanup(conn, store)
    assert_translated(raised.value, "apply retention")


async def test_a_pool_with_no_free_connection_is_a_store_error(store: StoreSettings) -> None:
    pool = StorePool(store, purpose="batch", max_size=1, timeout=0.1)
    await pool.open()
    try:
        async with pool.connection():
            with pytest.raises(StoreError) as raised:
                async with pool.connection("get a batch connection"):
                    pass
        assert_translated(raised.value, "get a batch connection")
    finally:
        await pool.close()
    with pytest.raises(StoreError) as raised:
        async with pool.connection("get a batch connection"):
            pass
    assert_translated(raised.value, "get a batch connection")  # the pool is closed


async def test_connection_errors_are_store_errors_without_the_password() -> None:
    store = make_store("postgresql://relayer:s3cret-pw@127.0.0.1:1/nowhere?connect_timeout=2")
    session = Session(store)
    with pytest.raises(StoreError) as raised:
        async with session.connection("heartbeat"):
            pass
    assert "s3cret-pw" not in str(raised.value)
    assert "store 'orders'" in str(raised.value)
    assert not isinstance(raised.value, psycopg.Error)


async def test_the_schema_check_before_serving_translates_driver_errors(
    store: StoreSettings,
) -> None:
    session = Session(store)
    try:
        async with session.connection("check the schema") as conn:
            await RelayStore(store).prepare(conn)  # the schema is applied: nothing to refuse
            assert terminate(store, pid=conn.info.backend_pid) == 1
            with pytest.raises(StoreError) as raised:
                await RelayStore(store).prepare(conn)
        assert_translated(raised.value, "check the schema")
    finally:
        await session.close()


async def test_a_worker_whose_every_connection_is_killed_keeps_relaying(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Housekeeping (heartbeats and probes), LISTEN, dispatcher and batch connections all die
    at once: the worker logs what it lost (no traceback), reconnects each, and relays the rows
    written afterwards."""
    store = make_store(
        pg_dsn,
        lanes=4,
        lease_duration="3s",
        poll_interval="0.2s",
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    memory = MemoryTransport()
    worker = Worker([store], transports={"orders": {"memory": memory}}, instance_id="member-a")
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="relayer"):
        task = asyncio.create_task(worker.run(stop))
        await asyncio.wait_for(worker.started.wait(), 10)
        try:
            write(store, ["a", "b"])
            await wait_for(lambda: pending(store) == 0)
            with psycopg.connect(store.require_dsn(), autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT count(*) FILTER (WHERE pg_catalog.pg_terminate_backend(pid, 10000)) "
                    "FROM pg_catalog.pg_stat_activity "
                    "WHERE datname = pg_catalog.current_database() "
                    "AND application_name LIKE 'relayer:orders:%%'"
                ).fetchone()
            # housekeeping, listen, dispatcher, batch
            assert killed is not None and killed[0] >= 4
            write(store, ["a", "c"])
            await wait_for(lambda: pending(store) == 0)
            await wait_for(lambda: "LISTEN on store orders lost" in caplog.text)
        finally:
            stop.set()
            await asyncio.wait_for(task, 15)
    assert len(memory.received_all()) >= 4  # at-least-once: a killed batch may resend
    assert "Traceback" not in caplog.text
    assert all(record.exc_info is None for record in caplog.records)


async def wait_for(predicate: Callable[[], bool], within: float = 20) -> None:
    async with asyncio.timeout(within):
        while not predicate():
            await asyncio.sleep(0.05)
