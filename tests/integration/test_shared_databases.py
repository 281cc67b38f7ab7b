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


async def listen_backend(store: StoreSettings) -> int | None:
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'relayer:%:listen'"
        )
        row = await cursor.fetchone()
        return None if row is None else int(row[0])


class Subscribed:
    """One store attached to a database of its own and subscribed to its LISTEN connection,
    recording what it is handed."""

    def __init__(self, store: StoreSettings) -> None:
        self.store = store
        self.database = Databases(WorkerSettings(), limit=10).get(store)
        self.woken: list[str] = []
        self.listening = 0

    async def __aenter__(self) -> Subscribed:
        await apply_schema(self.store)
        listener = self.database.listener
        assert listener is not None
        await self.database.attach(self.store)
        listener.subscribe(self.store, self.woken.append, self._listening)
        await self.until_listening(1)
        return self

    def _listening(self) -> None:
        self.listening += 1

    async def until_listening(self, times: int) -> None:
        async def listened() -> bool:
            return self.listening == times

        await until(listened)

    async def __aexit__(self, *exc: object) -> None:
        await self.database.detach(self.store)


async def test_every_notification_of_a_burst_arrives_in_commit_order(pg_dsn: str) -> None:
    """Hundreds of notifications in one read of the socket: each is handed over, in order."""
    store = make_store(pg_dsn, name="burst", table_prefix="burst_")
    async with Subscribed(store) as subscribed:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            async with conn.transaction():  # delivered together at commit
                for number in range(500):
                    await conn.execute(
                        "SELECT pg_notify(%s, %s)", (store.names.notify_channel, str(number))
                    )
            for number in range(500, 600):  # and one commit each
                await conn.execute(
                    "SELECT pg_notify(%s, %s)", (store.names.notify_channel, str(number))
                )

        async def all_woken() -> bool:
            return len(subscribed.woken) >= 600

        await until(all_woken)
        assert subscribed.woken == [str(number) for number in range(600)]


async def test_a_killed_listen_connection_is_replaced_and_notifications_resume(
    pg_dsn: str,
) -> None:
    """The server ends the LISTEN connection while it waits: the listener reconnects, LISTENs
    again (the store's ``listening`` runs again, to look for what was missed) and delivers the
    next notifications."""
    store = make_store(pg_dsn, name="killed", table_prefix="killed_", retry_backoff="50ms")
    async with Subscribed(store) as subscribed:
        first = await listen_backend(store)
        assert first is not None
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            await conn.execute("SELECT pg_terminate_backend(%s)", (first,))
        await subscribed.until_listening(2)
        assert await listen_backend(store) not in (None, first)
        await notify(store, "7")

        async def woken_again() -> bool:
            return subscribed.woken == ["7"]

        await until(woken_again)
