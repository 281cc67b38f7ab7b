"""Two stores of one database on one dispatcher connection (as a worker runs them): limits stay
exact per store, a store that leaves unlocks only its own slots, behind a transaction pooler
the transaction stays open while either store holds a slot, and a lost connection loses both
stores' slots; the last store out closes the connection and gives its budget unit back."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus

from relayer.dispatch import ClaimRequest, PostgresClusterState, QueueControl
from relayer.dispatch.dispatcher import DispatcherConnection
from relayer.settings import StoreSettings
from relayer.store.budget import ConnectionBudget
from relayer.store.driver import connect
from tests.conftest import apply_schema, make_store
from tests.integration.dispatch.helpers import server_pid, slots_in_use, wait_for_backend_exit
from tests.integration.pgbouncer.helpers import pooled


@pytest.fixture(params=["direct", "pgbouncer_strict"])
def through(request: pytest.FixtureRequest) -> Any:
    return None if request.param == "direct" else request.getfixturevalue(request.param)


async def two_stores(pg_dsn: str, through: Any) -> tuple[list[StoreSettings], list[StoreSettings]]:
    """Two stores of one database (directly, for controls and counts) and as the gates reach
    them (through PgBouncer when ``through``), each queue 'q' limited to 2."""
    direct = [make_store(pg_dsn, name=name, table_prefix=f"{name}_") for name in ("a", "b")]
    for store in direct:
        await apply_schema(store)
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            await QueueControl(conn, store.names).set_limit("q", 2)
    gated = (
        direct if through is None else [pooled(store, through, name=store.name) for store in direct]
    )
    return direct, gated


def request(budget: int) -> ClaimRequest:
    return ClaimRequest(("q",), (0,) * budget, budget)


async def test_stores_share_one_connection_and_keep_their_own_slots(
    pg_dsn: str, through: Any
) -> None:
    direct, gated = await two_stores(pg_dsn, through)
    budget = ConnectionBudget(5)
    shared = DispatcherConnection(
        lambda: connect(gated[0], purpose="test:dispatcher"),
        pinned=through is not None,
        budget=budget,
    )
    first = PostgresClusterState(gated[0], dispatcher=shared)
    second = PostgresClusterState(gated[1], dispatcher=shared)
    await first.open()
    await second.open()
    assert budget.reserved == 1  # one connection for both
    one = await first.acquire(request(5))
    two = await second.acquire(request(5))
    assert len(one.grants) == len(two.grants) == 2  # each store's limit, exact
    assert await slots_in_use(direct[0], "q") == 2 and await slots_in_use(direct[1], "q") == 2
    for grant in one.grants:
        first.release(grant.slot)
    await first.flush()
    assert await slots_in_use(direct[0], "q") == 0 and await slots_in_use(direct[1], "q") == 2
    conn = shared.conn
    assert conn is not None
    if through is not None:  # the other store still holds slots: the transaction stays open
        assert conn.info.transaction_status == TransactionStatus.INTRANS
    again = await first.acquire(request(1))
    await first.close()  # leaves holding a slot: only its own is unlocked
    assert not first.held and again.grants
    assert await slots_in_use(direct[0], "q") == 0 and await slots_in_use(direct[1], "q") == 2
    assert shared.conn is conn and not conn.closed and budget.reserved == 1
    for grant in two.grants:
        second.release(grant.slot)
    await second.flush()
    if through is not None:  # nobody holds a slot: the server connection is handed back
        assert conn.info.transaction_status == TransactionStatus.IDLE
    await second.close()
    assert conn.closed and budget.reserved == 0


async def test_a_lost_connection_loses_the_slots_of_every_store_on_it(
    pg_dsn: str, through: Any
) -> None:
    direct, gated = await two_stores(pg_dsn, through)
    shared = DispatcherConnection(
        lambda: connect(gated[0], purpose="test:dispatcher"), pinned=through is not None
    )
    async with (
        PostgresClusterState(gated[0], dispatcher=shared) as first,
        PostgresClusterState(gated[1], dispatcher=shared) as second,
    ):
        await first.acquire(request(1))
        held = await second.acquire(request(1))
        epoch = shared.epoch
        pid = await server_pid(first)
        assert shared.conn is not None
        await shared.conn.close()
        await wait_for_backend_exit(direct[0], pid)
        got = await first.acquire(request(2))  # reconnects: both stores' slots were lost
        assert shared.epoch != epoch
        assert first.held == 2 and second.held == 0
        second.release(held.grants[0].slot)  # of the lost connection: nothing to unlock
        await second.flush()
        assert len(got.grants) == 2
        assert await slots_in_use(direct[0], "q") == 2 and await slots_in_use(direct[1], "q") == 0
