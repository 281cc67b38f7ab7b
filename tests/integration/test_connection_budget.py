"""A worker's connection budget on real PostgreSQL (issue 16 item 2): 20 stores in 2 databases
served by one worker never hold more backends than ``worker.max_connections`` (counted in
pg_stat_activity by application_name all along), deliver every row in per-key order, and an
idle database ends up holding its fixed connections only. A budget too small for the fixed
connections is refused before anything connects, and a store joining a running worker shares
its database's connections or, for a database with no room left, is refused.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from relayer.errors import ConfigurationError
from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, fresh_database, make_store, with_database
from tests.integration.relay.helpers import bodies_by_key, first_deliveries_in_order, write
from tests.pgbouncer import PgBouncer

STORES_PER_DATABASE = 10
# Per database 3 fixed connections (housekeeping, LISTEN, dispatcher): 6, plus 4 batch ones.
BUDGET = 10
KEYS = [f"key-{number}" for number in range(6)]
PER_KEY = 5


@pytest.fixture
def second_dsn(pg_server: str, pg_template: str) -> Iterator[str]:
    """A second fresh database on the same server (dropped after the test)."""
    with fresh_database(pg_server, pg_template, f"relayer_budget_b_{os.getpid()}") as dsn:
        yield dsn


async def stores_in(
    dsn: str, first: int, count: int = STORES_PER_DATABASE, through: PgBouncer | None = None
) -> list[StoreSettings]:
    """``count`` stores of the database at ``dsn``, half in schema ``side``; ``through`` a
    PgBouncer in transaction mode (LISTEN on the database directly) when given."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA side")
    stores = []
    for number in range(first, first + count):
        store = make_store(
            dsn,
            name=f"s{number}",
            table_prefix=f"s{number}_",
            schema="side" if number % 2 else "public",
            lanes=4,
            lease_duration="3s",
            poll_interval="0.2s",
            transports={"memory": {"type": "memory"}},
            default_transport="memory",
        )
        await apply_schema(store)
        if through is not None:
            store = store.model_copy(
                update={"dsn": through.dsn_for(dsn), "pooler": "transaction", "listen_dsn": dsn}
            )
        stores.append(store)
    return stores


async def drained(stores: list[StoreSettings], within: float = 20) -> None:
    """Until no store has a row left (read on one connection per database, off the loop's
    way: the worker runs on this event loop)."""
    by_dsn: dict[str, list[StoreSettings]] = {}
    for store in stores:
        by_dsn.setdefault(store.require_dsn(), []).append(store)
    async with asyncio.timeout(within):
        for dsn, group in by_dsn.items():
            total = sql.SQL(" + ").join(
                sql.SQL("(SELECT count(*) FROM {})").format(
                    sql.Identifier(store.db_schema, f"{store.table_prefix}outbox")
                )
                for store in group
            )
            query = sql.SQL("SELECT {}").format(total)
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                while True:
                    row = await (await conn.execute(query)).fetchone()
                    if row is not None and int(row[0]) == 0:
                        break
                    await asyncio.sleep(0.05)


class Backends:
    """Samples the worker's backends in both databases (application_name relayer:*, named
    after the database's stores and the purpose) every few milliseconds, keeping the highest
    count seen."""

    def __init__(self, server: str, databases: list[str]) -> None:
        self.server = server
        self.databases = databases
        self.highest = 0
        self.samples = 0
        self.last: dict[str, int] = {}

    async def count(self, conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
        cursor = await conn.execute(
            "SELECT pg_catalog.split_part(application_name, ':', 3), count(*) "
            "FROM pg_catalog.pg_stat_activity "
            "WHERE datname = ANY(%s) AND application_name LIKE 'relayer:%%' "
            # The writers' wake-ups after their commits (relayer:waker) are this test's
            # process as an application, not the worker's.
            "AND application_name <> 'relayer:waker' "
            "GROUP BY 1",
            (self.databases,),
        )
        return {str(name): int(count) for name, count in await cursor.fetchall()}

    @asynccontextmanager
    async def sampling(self) -> AsyncIterator[None]:
        conn = await psycopg.AsyncConnection.connect(self.server, autocommit=True)
        stop = asyncio.Event()

        async def sample() -> None:
            while not stop.is_set():
                self.last = await self.count(conn)
                self.highest = max(self.highest, sum(self.last.values()))
                self.samples += 1
                await asyncio.sleep(0.005)

        task = asyncio.create_task(sample())
        try:
            yield
        finally:
            stop.set()
            await task
            await conn.close()


def database_name(dsn: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


async def until(predicate: Any, within: float = 20) -> None:
    async with asyncio.timeout(within):
        while not predicate():
            await asyncio.sleep(0.05)


async def test_twenty_stores_in_two_databases_stay_within_the_budget(
    pg_server: str, pg_dsn: str, second_dsn: str
) -> None:
    stores = await stores_in(pg_dsn, 0) + await stores_in(second_dsn, STORES_PER_DATABASE)
    brokers = {store.name: MemoryTransport("memory") for store in stores}
    settings = WorkerSettings(max_connections=BUDGET, batch_max_idle="0.5s")
    worker = Worker(
        stores,
        transports={name: {"memory": broker} for name, broker in brokers.items()},
        settings=settings,
        instance_id="budget",
    )
    assert worker.connections.slots == BUDGET - 6
    backends = Backends(pg_server, [database_name(pg_dsn), database_name(second_dsn)])
    stop = asyncio.Event()
    async with backends.sampling():
        task = asyncio.create_task(worker.run(stop))
        try:
            await asyncio.wait_for(worker.started.wait(), 20)
            written = {store.name: write(store, KEYS, PER_KEY) for store in stores}
            await drained(stores)
            # Drained and idle: each database closes its batch connections after
            # batch_max_idle and keeps only its 3 fixed ones. A server process leaves
            # pg_stat_activity before it hangs up, and the budget frees a unit only once it
            # has (relayer.store.driver.hang_up), so the sample may show none a moment
            # before the budget does: wait for both.
            budget = worker.databases.budget
            await until(lambda: backends.last.get("batch", 0) == 0 and budget.batch == 0)
            assert backends.last == {"housekeeping": 2, "listen": 2, "dispatcher": 2}
            assert budget.batch == 0
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)
    assert backends.samples > 10
    assert 6 < backends.highest <= BUDGET  # batches were seen, never past the budget
    assert worker.databases.budget.highest <= BUDGET
    for store in stores:
        received = brokers[store.name].received("events")
        assert {message.id for message in received} == set(written[store.name])
        assert first_deliveries_in_order(received)
        assert all(numbers == sorted(numbers) for numbers in bodies_by_key(received).values())


async def test_a_budget_without_room_for_every_database_is_refused(
    pg_dsn: str, second_dsn: str
) -> None:
    stores = [
        make_store(pg_dsn, name="a", table_prefix="a_"),
        make_store(pg_dsn, name="b", table_prefix="b_"),
        make_store(second_dsn, name="c", table_prefix="c_"),
    ]
    # Two databases: 3 fixed connections each and one batch connection each at least.
    with pytest.raises(ConfigurationError) as refused:
        Worker(stores, settings=WorkerSettings(max_connections=7))
    assert refused.value.field == "worker.max_connections"
    assert refused.value.value == 7
    assert "must be at least 8 for these stores" in refused.value.rule
    assert Worker(stores, settings=WorkerSettings(max_connections=8)).connections.slots == 2


async def test_through_pgbouncer_the_clients_stay_within_the_budget(
    pg_server: str, pg_dsn: str, second_dsn: str, pgbouncer: PgBouncer
) -> None:
    """The same through PgBouncer in transaction mode: the worker's client connections to it
    (SHOW CLIENTS) plus its direct LISTEN connections never exceed the budget, and the server
    connections PgBouncer opens for them (SHOW POOLS) stay within its pool size."""
    stores = await stores_in(pg_dsn, 0, 3, pgbouncer) + await stores_in(second_dsn, 3, 3, pgbouncer)
    brokers = {store.name: MemoryTransport("memory") for store in stores}
    budget = 8  # 2 x (housekeeping, dispatcher, direct LISTEN) + 2 batch connections
    worker = Worker(
        stores,
        transports={name: {"memory": broker} for name, broker in brokers.items()},
        settings=WorkerSettings(max_connections=budget),
        instance_id="budget",
    )
    names = [database_name(pg_dsn), database_name(second_dsn)]
    highest = {"clients": 0, "listen": 0, "total": 0, "servers": 0}
    stop = asyncio.Event()
    sampling = asyncio.Event()

    async def sample() -> None:
        console = await psycopg.AsyncConnection.connect(
            pgbouncer.dsn_for(with_database(pg_server, "pgbouncer")),
            autocommit=True,
            prepare_threshold=None,
        )
        direct = await psycopg.AsyncConnection.connect(pg_server, autocommit=True)
        try:
            while not stop.is_set():
                clients = [
                    row
                    for row in await show(console, "CLIENTS")
                    if row["database"] in names
                    and str(row.get("application_name") or "").startswith("relayer:s")
                ]
                cursor = await direct.execute(
                    "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE datname = ANY(%s) "
                    "AND application_name LIKE 'relayer:%%:listen'",
                    (names,),
                )
                row = await cursor.fetchone()
                listen = int(row[0]) if row else 0
                pools = [row for row in await show(console, "POOLS") if row["database"] in names]
                servers = max(
                    (
                        sum(int(row[k]) for k in ("sv_active", "sv_idle", "sv_used"))
                        for row in pools
                    ),
                    default=0,
                )
                for name, value in (
                    ("clients", len(clients)),
                    ("listen", listen),
                    ("total", len(clients) + listen),
                    ("servers", servers),
                ):
                    highest[name] = max(highest[name], value)
                sampling.set()
                await asyncio.sleep(0.01)
        finally:
            await console.close()
            await direct.close()

    sampler = asyncio.create_task(sample())
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.started.wait(), 20)
        await asyncio.wait_for(sampling.wait(), 10)
        written = {
            store.name: write(store.model_copy(update={"dsn": store.listen_dsn}), KEYS, PER_KEY)
            for store in stores
        }
        await drained([store.model_copy(update={"dsn": store.listen_dsn}) for store in stores])
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
        await sampler
    assert highest["listen"] == 2  # one per database, direct
    assert 6 < highest["total"] <= budget
    assert highest["servers"] <= pgbouncer.pool_size
    for store in stores:
        received = brokers[store.name].received("events")
        assert {message.id for message in received} == set(written[store.name])
        assert first_deliveries_in_order(received)


async def show(console: psycopg.AsyncConnection[Any], what: str) -> list[dict[str, Any]]:
    """``SHOW what`` on PgBouncer's admin console, rows as dicts."""
    cursor = await console.execute(f"SHOW {what}".encode())
    names = [column.name for column in cursor.description or ()]
    return [dict(zip(names, row, strict=True)) for row in await cursor.fetchall()]


async def test_stores_joining_a_running_worker_share_or_are_refused(
    pg_server: str, pg_dsn: str, second_dsn: str
) -> None:
    """A store of a database the worker serves joins on its connections; one of a database
    the budget has no room for is refused, naming the setting; the last store of a database
    to leave closes its connections."""
    first, joining = await stores_in(pg_dsn, 0, 2)
    [elsewhere] = await stores_in(second_dsn, 2, 1)
    worker = Worker(
        [first],
        transports={first.name: {"memory": MemoryTransport("memory")}},
        settings=WorkerSettings(max_connections=5),  # 3 fixed + 2 batch, one database
        instance_id="budget",
    )
    backends = Backends(pg_server, [database_name(pg_dsn), database_name(second_dsn)])
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.started.wait(), 20)
        await worker.add_store(joining, {"memory": MemoryTransport("memory")})
        assert worker.databases.budget.reserved == 3  # no connection more for it
        with pytest.raises(ConfigurationError) as refused:
            await worker.add_store(elsewhere, {"memory": MemoryTransport("memory")})
        assert refused.value.field == "worker.max_connections"
        assert "must be at least 8" in refused.value.rule
        assert sorted(worker.stores) == ["s0", "s1"]
        await worker.remove_store(first.name)
        assert worker.databases.budget.reserved == 3  # s1 still uses them
        await worker.remove_store(joining.name)
        assert worker.databases.budget.used == 0
        async with backends.sampling():
            await until(lambda: backends.samples > 0 and not backends.last)
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
