"""Batch pools drawing on one connection budget (relayer.store.budget) on real PostgreSQL:
the budget is never exceeded, an idle connection of another database is closed to open one,
a connection returned while another database waits is handed over (first come first served),
reservations go first, waits end in ConnectionsBusy, idle connections age out, and a closed
connection's unit is free only once its server process is gone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import psycopg
import pytest

from relayer.errors import ConnectionsBusy
from relayer.settings import StoreSettings
from relayer.store.budget import BatchPool, ConnectionBudget
from relayer.store.driver import Connection, hang_up
from tests.conftest import make_store


def pools(
    store: StoreSettings, budget: ConnectionBudget, *, max_idle: float = 60.0
) -> list[BatchPool]:
    made = [BatchPool(budget, store, name=f"test:{n}", max_idle=max_idle) for n in range(2)]
    for pool in made:
        pool.open()
    return made


@asynccontextmanager
async def closing(*made: BatchPool) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for pool in made:
            await pool.close()


async def hold(pool: BatchPool, count: int, stack: AsyncExitStack) -> list[Connection]:
    return [await stack.enter_async_context(pool.connection()) for _ in range(count)]


async def waiting_for(pool: BatchPool) -> asyncio.Task[Connection]:
    """A task asking ``pool`` for a connection, once it has had a moment to start waiting."""
    task = asyncio.create_task(pool._get(pool.store, "test", 5.0))
    await asyncio.sleep(0.05)
    return task


async def test_an_idle_connection_of_another_database_is_closed_to_open_one(pg_dsn: str) -> None:
    budget = ConnectionBudget(2)
    first, second = pools(make_store(pg_dsn), budget)
    async with closing(first, second):
        async with AsyncExitStack() as stack:
            await hold(first, 2, stack)
        assert (first.opened, len(first.idle), budget.batch) == (2, 2, 2)
        async with second.connection() as conn:
            await conn.execute("SELECT 1")
            assert (first.opened, second.opened, budget.batch) == (1, 1, 2)
        assert budget.highest == 2


async def test_a_connection_returned_while_another_database_waits_is_handed_over(
    pg_dsn: str,
) -> None:
    budget = ConnectionBudget(2)
    first, second = pools(make_store(pg_dsn), budget)
    async with closing(first, second):
        async with AsyncExitStack() as held:
            await hold(first, 2, held)
            waiting = await waiting_for(second)
            assert not waiting.done()  # every unit is in use
            late = await waiting_for(first)
            assert not late.done()
            await held.aclose()  # both of first's come back: the oldest waiter is second's
            conn = await asyncio.wait_for(waiting, 5)
            mine = await asyncio.wait_for(late, 5)
        assert (first.opened, second.opened, budget.batch) == (1, 1, 2)
        await second._put(conn)
        await first._put(mine)
        assert budget.highest == 2 and budget.used == 2


async def test_a_wait_that_gets_nothing_ends_in_connections_busy(pg_dsn: str) -> None:
    budget = ConnectionBudget(1)
    first, second = pools(make_store(pg_dsn), budget)
    async with closing(first, second), first.connection():
        with pytest.raises(ConnectionsBusy, match=r"worker\.max_connections = 1"):
            async with second.connection(wait=0.05):
                pass
        assert not budget._waiters and budget.batch == 1


async def test_a_cancelled_wait_gives_nothing_away(pg_dsn: str) -> None:
    budget = ConnectionBudget(1)
    first, second = pools(make_store(pg_dsn), budget)
    async with closing(first, second):
        async with first.connection():
            waiting = await waiting_for(second)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        assert not budget._waiters and budget.batch == 1 and len(first.idle) == 1


async def test_a_reservation_goes_before_batches(pg_dsn: str) -> None:
    budget = ConnectionBudget(2)
    first, second = pools(make_store(pg_dsn), budget)
    async with closing(first, second):
        async with AsyncExitStack() as held:
            await hold(first, 2, held)
            reserving = asyncio.create_task(budget.reserve())
            await asyncio.sleep(0.05)
            waiting = await waiting_for(second)
            assert not reserving.done() and not waiting.done()
        # first's two connections were closed: one unit for the reservation, then one for
        # second's waiter (not kept idle by first).
        await asyncio.wait_for(reserving, 5)
        conn = await asyncio.wait_for(waiting, 5)
        assert (budget.reserved, budget.batch, first.opened, second.opened) == (1, 1, 0, 1)
        await second._put(conn)
        budget.unreserve()
        assert budget.highest == 2


async def test_a_connection_left_in_a_transaction_is_rolled_back_and_reused(pg_dsn: str) -> None:
    budget = ConnectionBudget(1)
    first, second = pools(make_store(pg_dsn), budget)
    async with closing(first, second):
        async with first.connection() as conn:
            await conn.execute("SELECT 1")  # opens a transaction (autocommit off)
        async with first.connection() as again:
            assert again is conn
            assert conn.info.transaction_status.name == "IDLE"


async def test_a_connection_returned_idle_goes_to_a_waiter_of_its_pool_as_it_is(
    pg_dsn: str,
) -> None:
    budget = ConnectionBudget(1)
    first, second = pools(make_store(pg_dsn), budget)
    async with closing(first, second):
        async with first.connection() as conn:
            await conn.execute("SELECT 1")
            await conn.commit()  # idle again: it goes back without a rollback
            waiting = await waiting_for(first)
            assert not waiting.done()
        assert await asyncio.wait_for(waiting, 5) is conn
        assert (first.opened, len(first.idle), budget.batch) == (1, 0, 1)
        await first._put(conn)
        assert len(first.idle) == 1 and budget.highest == 1


async def test_a_cancelled_block_returns_its_idle_connection_and_keeps_the_unit(
    pg_dsn: str,
) -> None:
    budget = ConnectionBudget(1)
    first, second = pools(make_store(pg_dsn), budget)
    entered = asyncio.Event()

    async def batch() -> None:
        async with first.connection() as conn:
            await conn.execute("SELECT 1")
            await conn.commit()
            entered.set()
            await asyncio.sleep(60)

    async with closing(first, second):
        task = asyncio.create_task(batch())
        await asyncio.wait_for(entered.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (first.opened, len(first.idle), budget.batch) == (1, 1, 1)
        async with second.connection() as other:  # the unit is handed on, not lost
            await other.execute("SELECT 1")
        assert (first.opened, second.opened, budget.batch) == (0, 1, 1)


async def test_an_idle_connection_returned_to_a_closed_pool_is_closed(pg_dsn: str) -> None:
    budget = ConnectionBudget(1)
    first, second = pools(make_store(pg_dsn), budget)
    async with closing(first, second):
        async with first.connection() as conn:
            await conn.commit()
            await first.close()  # the pool's last store left while the batch ran
        assert conn.closed
        assert (first.opened, len(first.idle), budget.batch) == (0, 0, 0)


async def test_idle_connections_are_closed_after_max_idle(pg_dsn: str) -> None:
    budget = ConnectionBudget(4)
    first, second = pools(make_store(pg_dsn), budget, max_idle=0.1)
    async with closing(first, second):
        async with AsyncExitStack() as held:
            await hold(first, 3, held)
        assert first.opened == 3
        async with asyncio.timeout(5):
            while first.opened:
                await asyncio.sleep(0.02)
        assert budget.batch == 0 and not first.idle


async def test_a_hung_up_connection_has_left_pg_stat_activity(pg_dsn: str) -> None:
    """What a budget unit waits for before it is free again: right after a plain close the
    server process is usually still listed (13 of 20 times on a 2-core machine)."""
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
        for _ in range(10):
            conn = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
            pid = conn.info.backend_pid
            await hang_up(conn)
            cursor = await admin.execute(
                "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = %s", (pid,)
            )
            assert await cursor.fetchone() == (0,)


async def test_available_counts_the_connections_to_be_had_without_waiting(pg_dsn: str) -> None:
    budget = ConnectionBudget(3)
    first, second = pools(make_store(pg_dsn), budget)
    async with closing(first, second):
        assert (first.available(), second.available()) == (3, 3)
        async with AsyncExitStack() as stack:
            await hold(first, 2, stack)
            assert (first.available(), second.available()) == (1, 1)
        # Its own idle connections, and the unit left; another database's idle ones are not
        # counted (taking them closes a connection to open one).
        assert (first.available(), second.available()) == (3, 1)
        async with AsyncExitStack() as stack:
            await hold(first, 3, stack)
            assert first.available() == 0
            waiting = asyncio.ensure_future(hold(second, 1, stack))
            await asyncio.sleep(0)
            assert second.available() == 0  # a waiter goes first
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
    unlimited = BatchPool(ConnectionBudget(None), make_store(pg_dsn), name="test:unlimited")
    unlimited.open()
    assert unlimited.available() > 1_000
    await unlimited.close()
    assert unlimited.available() == 0
