"""Each kind of role works with exactly the grants `relayer schema grants` prints.

The database's default privileges for PUBLIC (CONNECT, TEMPORARY) are revoked, so a role has
only what the printed statements give it: the writer writes (and cannot delete), the worker
relays a batch, the operator's commands all work.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

import psycopg
import pytest
from psycopg import sql

from relayer import Outbox, OutboxMessage
from relayer.operations.grants import Kind, render
from relayer.settings import StoreSettings, WorkerSettings
from relayer.store import rotate
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.acceptance.cli import environment, relayer
from tests.conftest import apply_schema, make_store, with_user
from tests.integration.relay.helpers import pending, write


class RoleMaker(Protocol):
    def __call__(
        self, kind: Kind, store: StoreSettings | None = None, *, without_temp: bool = False
    ) -> StoreSettings: ...


@pytest.fixture
async def owner_store(pg_dsn: str) -> StoreSettings:
    store = make_store(pg_dsn, lanes=4, lease_duration="3s", poll_interval="0.1s")
    await apply_schema(store)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(
                sql.Identifier(conn.info.dbname)
            )
        )
    return store


@pytest.fixture
def role_of(owner_store: StoreSettings) -> Iterator[RoleMaker]:
    """A maker of login roles holding exactly the printed grants of a kind."""
    created: list[str] = []
    dsn = owner_store.require_dsn()

    def make(
        kind: Kind, store: StoreSettings | None = None, *, without_temp: bool = False
    ) -> StoreSettings:
        store = store or owner_store
        role = f"relayer_{kind}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        script = render(store, kind, role)
        if without_temp:
            script = "\n".join(line for line in script.splitlines() if "TEMPORARY ON" not in line)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            created.append(role)
            conn.execute(script.encode())
        return store.model_copy(update={"dsn": with_user(dsn, role)})

    yield make
    with psycopg.connect(dsn, autocommit=True) as conn:
        for role in created:
            conn.execute(
                "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity "
                "WHERE usename = %s",
                (role,),
            )
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_writer_writes_and_can_do_nothing_else(
    owner_store: StoreSettings, role_of: RoleMaker
) -> None:
    writer = role_of("writer")
    with psycopg.connect(writer.require_dsn()) as conn:
        outbox = Outbox(writer)
        outbox.write(conn, destination="events", body=b"1", key="customer-1")
        outbox.write_many(conn, [OutboxMessage("events", b"2", key="customer-2")])
        outbox.write(conn, destination="events", body=b"3")
        conn.commit()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"DELETE FROM {writer.table_prefix}outbox")
    assert pending(owner_store) == 3


def test_a_writer_numbering_messages_gets_its_sequences_grant(
    owner_store: StoreSettings, role_of: RoleMaker
) -> None:
    writer = role_of("writer", owner_store.model_copy(update={"sequence_numbers": True}))
    with psycopg.connect(writer.require_dsn()) as conn:
        Outbox(writer).write(conn, destination="events", body=b"1", key="customer-1")
        Outbox(writer).write_many(conn, [OutboxMessage("events", b"2", key="customer-1")])
        conn.commit()
    assert pending(owner_store) == 2


async def relay_all(store: StoreSettings) -> MemoryTransport:
    broker = MemoryTransport("memory")
    worker = Worker(
        [store], transports={store.name: {"memory": broker}}, settings=WorkerSettings(pool_size=4)
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        async with asyncio.timeout(30):
            while pending(store):
                if task.done():
                    await task  # raises what stopped the worker
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    return broker


async def test_the_worker_relays_with_its_grants(
    owner_store: StoreSettings, role_of: RoleMaker
) -> None:
    worker = role_of("worker")
    write(owner_store, [f"customer-{n}" for n in range(20)], per_key=3, transport="memory")
    broker = await relay_all(worker)
    assert len(broker.received_all()) == 60
    assert pending(owner_store) == 0


def newest_partition(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(
        "SELECT max(substr(relname, 10)) FROM pg_catalog.pg_class "
        "WHERE relkind = 'r' AND relname ~ '^parts_op_[0-9]'"
    ).fetchone()
    assert row is not None
    return str(row[0])


async def test_the_worker_relays_a_partitioned_store_with_its_grants(
    owner_store: StoreSettings, role_of: RoleMaker
) -> None:
    store = owner_store.model_copy(update={"table_prefix": "parts_", "storage": "partitioned"})
    await apply_schema(store)
    worker = role_of("worker", store)
    write(store, [f"customer-{n}" for n in range(20)], per_key=3, transport="memory")
    broker = await relay_all(worker)
    assert len(broker.received_all()) == 60
    assert pending(store) == 0
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:  # one partition to make
        conn.execute("DROP TABLE parts_op_" + newest_partition(conn))
    refused = await rotate(worker)  # no grant lets a worker's role rotate: admin_dsn does
    assert refused.skipped is not None and "admin_dsn" in refused.skipped


async def test_the_worker_relays_without_temp(
    owner_store: StoreSettings, role_of: RoleMaker
) -> None:
    worker = role_of("worker", without_temp=True)
    write(owner_store, ["customer-1"], per_key=3, transport="memory")
    await relay_all(worker)
    assert pending(owner_store) == 0


def test_the_operator_commands_work_with_its_grants(
    owner_store: StoreSettings, role_of: RoleMaker
) -> None:
    operator = role_of("operator")
    write(owner_store, ["customer-1", "customer-2"], per_key=2, transport="memory")
    with psycopg.connect(owner_store.require_dsn(), autocommit=True) as conn:
        for key in ("customer-1", "customer-2"):
            conn.execute(
                f"INSERT INTO {owner_store.table_prefix}parked "
                "(ordering_key, lane, head_id, attempts, last_error) "
                f"SELECT ordering_key, lane, min(id::text)::uuid, 10, 'broker said no' "
                f"FROM {owner_store.table_prefix}outbox WHERE ordering_key = %s "
                "GROUP BY ordering_key, lane",
                (key,),
            )
    env = environment(operator)
    for arguments in (
        ("status", "orders"),
        ("status", "--json", "orders"),
        ("parked", "list", "orders"),
        ("parked", "redrive", "orders", "--key", "customer-1"),
        ("parked", "drop", "orders", "--key", "customer-2"),
        ("queue", "pause", "orders"),
        ("queue", "resume", "orders", "--reason", "done"),
        ("queue", "limit", "orders", "2"),
        ("queue", "status", "orders"),
    ):
        result = relayer(*arguments, env=env)
        assert result.returncode == 0, (arguments, result.stdout, result.stderr)
    assert pending(owner_store) == 2  # customer-1's rows, redriven; customer-2's dropped


async def test_an_owners_cron_job_rotates_for_a_worker_role_that_may_not(
    owner_store: StoreSettings, role_of: RoleMaker
) -> None:
    store = owner_store.model_copy(update={"table_prefix": "parts_", "storage": "partitioned"})
    await apply_schema(store)
    worker = role_of("worker", store)
    operator = role_of("operator", store)
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:  # one partition to make
        newest = "parts_op_" + newest_partition(conn)
        conn.execute(f"ALTER TABLE parts_outbox DETACH PARTITION {newest}")
        conn.execute("DROP TABLE " + newest)
    partitioned = {
        "RELAYER_STORES__ORDERS__TABLE_PREFIX": "parts_",
        "RELAYER_STORES__ORDERS__STORAGE": "partitioned",
    }
    refused = relayer("partitions", "rotate", "orders", env=environment(worker, **partitioned))
    assert refused.returncode == 1, refused.stderr
    [line] = refused.stderr.splitlines()
    assert "the rotation stopped early" in line and "stores.orders.admin_dsn" in line
    # The operator reads the health of the partitions (the catalog only).
    status = relayer("status", "orders", env=environment(operator, **partitioned))
    assert status.returncode == 0, status.stderr
    assert "parts_outbox: the sum over its" in status.stdout
    # The same job with the owner's connection as admin_dsn: the worker's role keeps its dsn.
    owner = {"RELAYER_STORES__ORDERS__ADMIN_DSN": store.require_dsn(), **partitioned}
    rotated = relayer("partitions", "rotate", "orders", env=environment(worker, **owner))
    assert rotated.returncode == 0, rotated.stderr
    assert newest in rotated.stdout
