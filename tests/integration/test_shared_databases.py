"""The connections the stores of one database share in a worker (relayer.store.databases), on
real PostgreSQL: stores join and leave a running database, one LISTEN connection routes each
store's notifications to it, and the last store out closes everything and gives the budget back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import psycopg

from relayer.settings import StoreSettings, WorkerSettings
from relayer.store.databases import Databases
from tests.conftest import apply_schema, make_store


async def notify(store: StoreSettings, payload: str) -> None:
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        await conn.execute("SELECT pg_notify(%s, %s)", (store.names.notify_channel, payload))


async def backends(store: StoreSettings) -> dict[str, int]:
    """The worker's backends in the store's database, by purpose."""
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT split_part(application_name, ':', 3), count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'relayer:%' "
            "GROUP BY 1"
        )
        return {str(purpose): int(count) for purpose, count in await cursor.fetchall()}


async def until(check: Callable[[], Awaitable[bool]], within: float = 10) -> None:
    async with asyncio.timeout(within):
        while not await check():
            await asyncio.sleep(0.02)


async def test_stores_join_and_leave_a_database_that_keeps_running(pg_dsn: str) -> None:
    stores = [make_store(pg_dsn, name=name, table_prefix=f"{name}_") for name in ("a", "b")]
    for store in stores:
        await apply_schema(store)
    first, second = stores
    databases = Databases(WorkerSettings(), limit=10)
    database = databases.get(first)
    assert databases.get(second) is database
    woken: dict[str, list[str]] = {"a": [], "b": []}
    listening: list[str] = []
    listener = database.listener
    assert listener is not None

    await database.attach(first)
    listener.subscribe(first, woken["a"].append, lambda: listening.append("a"))
    await database.attach(second)  # joins while the first is served
    listener.subscribe(second, woken["b"].append, lambda: listening.append("b"))
    assert databases.budget.reserved == 2  # housekeeping and LISTEN, once for both

    async def both_listening() -> bool:
        return sorted(listening) == ["a", "b"]

    await until(both_listening)
    await notify(first, "3")
    await notify(second, "")

    async def both_woken() -> bool:
        return woken == {"a": ["3"], "b": [""]}

    await until(both_woken)
    for store in stores:
        async with database.housekeeping.for_store(store).connection("probe") as conn:
            await conn.execute("SELECT 1")
    assert await backends(first) == {"housekeeping": 1, "listen": 1}

    await database.detach(first)  # leaves: the second keeps the connections
    await notify(first, "1")
    await notify(second, "2")

    async def second_woken_again() -> bool:
        return woken["b"] == ["", "2"]

    await until(second_woken_again)
    assert woken["a"] == ["3"]  # notified before the second's: would have come first
    assert await backends(first) == {"housekeeping": 1, "listen": 1}
    assert databases.budget.reserved == 2

    await database.detach(second)  # the last one out closes them

    async def none_left() -> bool:
        return await backends(first) == {}

    await until(none_left)
    assert databases.budget.used == 0
