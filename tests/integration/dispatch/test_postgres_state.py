"""PostgresClusterState and QueueControl against a real PostgreSQL."""

import asyncio
from typing import Any

import psycopg
import pytest

from relayer.dispatch import (
    ClaimRequest,
    GateState,
    ManualClock,
    MemoryQueue,
    PostgresClusterState,
    QueueControl,
    Strict,
    Weighted,
    WorkerGroup,
)
from relayer.dispatch.control import queue_lock_key
from relayer.errors import ConfigurationError, DispatchError, SchemaNotAppliedError
from relayer.operations import schema
from relayer.settings import StoreSettings
from tests.conftest import make_store
from tests.integration.dispatch.helpers import (
    CountingConnection,
    count_wire,
    server_pid,
    slots_in_use,
)
from tests.integration.pgbouncer.helpers import pooled
from tests.unit.dispatch.harness import Held, running, settle


@pytest.fixture(params=["direct", "pgbouncer_strict"])
def gated(request: pytest.FixtureRequest, store: StoreSettings) -> StoreSettings:
    """The store as the gates reach it: directly, or through PgBouncer pooling by transaction
    (DISCARD ALL whenever a server connection changes hands), where a dispatcher holds its
    slots inside a transaction it keeps open meanwhile. Controls and counts stay direct."""
    if request.param == "direct":
        return store
    return pooled(store, request.getfixturevalue(request.param))


async def control(store: StoreSettings) -> QueueControl:
    conn = await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True)
    return QueueControl(conn, store.names)


def request(*queues: str, order: tuple[int, ...] | None = None, budget: int = 10) -> ClaimRequest:
    if order is None:
        order = tuple(index for index in range(len(queues)) for _ in range(budget))
    return ClaimRequest(queues, order, budget)


async def test_the_migration_creates_the_queue_tables_and_check_stays_clean(
    store: StoreSettings,
) -> None:
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        assert await schema.check(conn, store) == []
        cursor = await conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE 'orders_queue%' ORDER BY 1"
        )
        assert [row[0] for row in await cursor.fetchall()] == [
            "orders_queue_events",
            "orders_queues",
        ]
        cursor = await conn.execute(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'public' AND p.proname LIKE '%claim%'"
        )
        # The claim function is the store's (versioned), so a worker needs no TEMP privilege.
        assert await cursor.fetchall() == [("orders_claim_slots_v1",)]


async def test_a_limit_is_exact_across_connections(
    store: StoreSettings, gated: StoreSettings
) -> None:
    admin = await control(store)
    await admin.set_limit("q", 3)
    async with PostgresClusterState(gated) as first, PostgresClusterState(gated) as second:
        got = await first.acquire(request("q", budget=2))
        assert [grant.slot.number for grant in got.grants] == [0, 1]
        assert got.gates[0].state is GateState.OPEN and got.gates[0].limit == 3
        more = await second.acquire(request("q", budget=5))
        assert [grant.slot.number for grant in more.grants] == [2]
        assert more.gates[0].state is GateState.FULL
        assert (await first.acquire(request("q"))).grants == ()
        assert await slots_in_use(store, "q") == 3
        first.release(got.grants[0].slot)
        await first.flush()  # release() already scheduled it; this waits for it
        assert await slots_in_use(store, "q") == 2
        again = await second.acquire(request("q"))
        assert [grant.slot.number for grant in again.grants] == [0]
        assert second.held == 2
        status = {state.queue: state for state in await admin.status()}
        assert status["q"].limit == 3 and status["q"].slots_in_use == 3
    assert await slots_in_use(store, "q") == 0  # closing the connections freed everything


async def test_queues_without_a_limit_take_no_lock(
    store: StoreSettings, gated: StoreSettings
) -> None:
    async with PostgresClusterState(gated) as state:
        result = await state.acquire(request("free", budget=4))
        assert [grant.slot.number for grant in result.grants] == [None] * 4
        assert state.held == 0
        assert await slots_in_use(store, "free") == 0


async def test_a_slot_released_in_a_pass_is_granted_again_in_that_pass(
    store: StoreSettings,
    gated: StoreSettings,
) -> None:
    await (await control(store)).set_limit("q", 1)
    async with PostgresClusterState(gated) as state:
        [grant] = (await state.acquire(request("q"))).grants
        state.release(grant.slot)
        [again] = (await state.acquire(request("q"))).grants  # release + claim: one call
        assert again.slot.number == 0
        assert await slots_in_use(store, "q") == 1


async def test_pause_stops_the_next_claim_of_another_connection(
    store: StoreSettings, gated: StoreSettings
) -> None:
    admin = await control(store)
    async with PostgresClusterState(gated) as state:
        assert len((await state.acquire(request("q", budget=1))).grants) == 1
        await admin.pause("q", reason="disk full", by="ops@box:1")
        paused = await state.acquire(request("q", "other"))
        assert [grant.queue_index for grant in paused.grants] == [1] * 10  # reflowed
        assert paused.gates[0].state is GateState.PAUSED
        await admin.pause(None, reason="maintenance", by="ops@box:1")
        everything = await state.acquire(request("q", "other"))
        assert everything.grants == ()
        assert [gate.state for gate in everything.gates] == [GateState.PAUSED] * 2
        await admin.resume(None, by="ops@box:2")
        await admin.resume("q", by="ops@box:2")
        assert len((await state.acquire(request("q", budget=1))).grants) == 1
    events = [(e.queue, e.action, e.actor, e.reason) for e in await admin.events()]
    assert events == [
        ("q", "resume", "ops@box:2", None),
        ("*", "resume", "ops@box:2", None),
        ("*", "pause", "ops@box:1", "maintenance"),
        ("q", "pause", "ops@box:1", "disk full"),
    ]
    [every, q] = await admin.status()
    assert (every.queue, every.paused, every.changed_by) == ("*", False, "ops@box:2")
    assert (q.queue, q.paused, q.changed_at is not None) == ("q", False, True)


async def test_queue_names_reach_the_claim_as_they_are(
    store: StoreSettings, gated: StoreSettings
) -> None:
    # The claim binds the names as one JSON text: commas, quotes, braces, backslashes and
    # non-ASCII letters must neither split a name nor change it.
    odd = ["a,b", 'say "hi"', "{x}", "back\\slash", "zürich", "NULL", ""]
    admin = await control(store)
    await admin.pause("a,b")
    await admin.set_limit("zürich", 1)
    async with PostgresClusterState(gated) as state:
        result = await state.acquire(request(*odd, budget=1))
        states = [gate.state for gate in result.gates]
        assert states[0] is GateState.PAUSED
        assert states[1:] == [GateState.OPEN] * (len(odd) - 1)
        result = await state.acquire(request("a", "b", "zürich", budget=2))
        assert [grant.queue_index for grant in result.grants] == [0, 0]  # "a" is not paused
        [limited] = (await state.acquire(request("zürich"))).grants
        assert limited.slot.number == 0
        assert await slots_in_use(store, "zürich") == 1


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3", 2**31, 2**63])
async def test_a_bad_limit_is_rejected_with_a_clear_message(
    store: StoreSettings, bad: object
) -> None:
    admin = await control(store)
    with pytest.raises(ConfigurationError) as caught:
        await admin.set_limit("q", bad)  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"limit: {bad!r} is invalid: must be an integer from 1 to 2,147,483,647, or None "
        "('none' on the command line) to remove the limit"
    )
    assert await admin.events() == ()


async def test_none_clears_a_limit(store: StoreSettings, gated: StoreSettings) -> None:
    admin = await control(store)
    await admin.set_limit("q", 1)
    await admin.set_limit("q", None, reason="no longer needed")
    async with PostgresClusterState(gated) as state:
        assert len((await state.acquire(request("q", budget=5))).grants) == 5
    [cleared, limited] = await admin.events()
    assert (cleared.action, cleared.limit, cleared.reason) == ("limit", None, "no longer needed")
    assert (limited.action, limited.limit) == ("limit", 1)


async def test_a_weighted_pass_costs_one_round_trip(
    store: StoreSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    count_wire(monkeypatch)
    admin = await control(store)
    await admin.set_limit("a", 2)
    await admin.pause("b")
    queues = [MemoryQueue[int](name) for name in "abc"]
    for queue in queues:
        for key in range(20):
            queue.schedule(key, 0.0)

    async def counting() -> psycopg.AsyncConnection[Any]:
        return await CountingConnection.connect(store.require_dsn(), autocommit=True)

    async with PostgresClusterState(store, connector=counting) as state:
        held = Held()
        policy = Weighted([("a", 6), ("b", 3), ("c", 1)])
        group = WorkerGroup(
            policy, queues, held, pool_size=8, cluster_state=state, clock=ManualClock()
        )
        before = CountingConnection.statements
        async with running(group, held):
            assert group.last_pass is not None
            assert group.last_pass.claimed == (2, 0, 6)
            assert [gate for gate in group.last_pass.gates] == [
                GateState.FULL,
                GateState.PAUSED,
                GateState.OPEN,
            ]
            assert CountingConnection.statements - before == 1
        await state.flush()  # the group's releases unlock in a task of their own
        assert await slots_in_use(store, "a") == 0


async def test_a_group_with_a_limit_claims_again_when_a_slot_frees(
    store: StoreSettings, gated: StoreSettings
) -> None:
    await (await control(store)).set_limit("q", 2)
    queue: MemoryQueue[int] = MemoryQueue("q")
    for key in range(5):
        queue.schedule(key, 0.0)
    held = Held()
    async with PostgresClusterState(gated) as state:
        group = WorkerGroup(Strict("q"), [queue], held, cluster_state=state, clock=ManualClock())
        async with running(group, held):
            assert group.running == 2 and await slots_in_use(store, "q") == 2
            held.finish(1)
            await settle(group, running=2)
            assert len(held.started) == 3
            assert await slots_in_use(store, "q") == 2


async def test_a_failed_claim_leaves_no_stray_lock(
    store: StoreSettings, gated: StoreSettings
) -> None:
    await (await control(store)).set_limit("q", 2)
    async with PostgresClusterState(gated) as state:
        [grant] = (await state.acquire(request("q", budget=1))).grants
        conn = state._shared.conn
        assert conn is not None
        # As if a call had died half-way through: a lock the process does not know it holds.
        await conn.execute("SELECT pg_advisory_lock(%s, 1)", (queue_lock_key(store.names, "q"),))
        await conn.execute("ALTER TABLE orders_queues RENAME TO orders_queues_moved")
        with pytest.raises(DispatchError, match="claiming queue slots failed"):
            await state.acquire(request("q"))
        assert await slots_in_use(store, "q") == 1  # only the slot its job holds
        await conn.execute("ALTER TABLE orders_queues_moved RENAME TO orders_queues")
        assert state.held == 1 and grant.slot.number == 0


async def test_a_cancelled_claim_gives_its_slots_back(
    store: StoreSettings, gated: StoreSettings
) -> None:
    await (await control(store)).set_limit("q", 3)
    async with PostgresClusterState(gated) as state:
        task = asyncio.create_task(state.acquire(request("q", budget=3)))
        await asyncio.sleep(0)  # the call is on its way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The next call waits for the cancelled one and sends its release in the same trip.
        assert (await state.acquire(request("q", budget=0))).grants == ()
        await state.flush()
        assert await slots_in_use(store, "q") == 0 and state.held == 0


async def test_a_lost_connection_is_reported_then_replaced(
    store: StoreSettings, gated: StoreSettings
) -> None:
    await (await control(store)).set_limit("q", 1)
    async with PostgresClusterState(gated) as state:
        [grant] = (await state.acquire(request("q"))).grants
        old_pid = await server_pid(state)
        async with await psycopg.AsyncConnection.connect(store.require_dsn()) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
        with pytest.raises(DispatchError):
            await state.acquire(request("q"))
        [again] = (await state.acquire(request("q"))).grants  # the dead slot is free again
        assert await server_pid(state) != old_pid and again.slot.number == 0
        state.release(grant.slot)  # from the dead connection: ignored
        assert state.held == 1


async def test_a_store_without_the_queue_tables_is_refused(pg_dsn: str) -> None:
    state = PostgresClusterState(make_store(pg_dsn))
    with pytest.raises(SchemaNotAppliedError, match="relayer schema apply orders"):
        await state.open()
    with pytest.raises(DispatchError, match="relayer schema apply orders"):
        await state.acquire(request("q"))


async def test_stores_have_distinct_lock_keys(pg_dsn: str) -> None:
    one, two = make_store(pg_dsn), make_store(pg_dsn, name="b", table_prefix="billing_")
    assert queue_lock_key(one.names, "q") != queue_lock_key(two.names, "q")
    assert queue_lock_key(one.names, "q") != queue_lock_key(one.names, "r")
    assert 0 <= queue_lock_key(one.names, "q") < 2**31


async def test_the_claim_without_limits_answers_as_the_claim_function(
    store: StoreSettings,
) -> None:
    """Without a concurrency limit and nothing to release, the claim statement answers without
    calling the claim function: its rows must be the function's, row for row, whatever is
    paused (one queue, the other, every queue), the budget and the wanted order."""
    from relayer.sql import queries_for
    from relayer.store.dispatch import SlotStatements

    names = store.names
    statements = SlotStatements(names, pinned=False)
    function = psycopg.sql.SQL(
        "SELECT * FROM {}(%s, %s, %s, %s, %s, %s, '{{}}', '{{}}', '{{}}', '{{}}')"
    ).format(psycopg.sql.Identifier(names.schema, names.function("claim_slots")))
    queues = ["a", "b", "c"]
    keys = [queue_lock_key(names, queue) for queue in queues]
    states = queries_for(names)
    cases = 0
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        for paused in [(), ("a",), ("b", "c"), ("*",)]:
            for queue in ["a", "b", "c", "*"]:
                await conn.execute(
                    states["queue_set_pause"],
                    {"queue": queue, "paused": queue in paused, "actor": "t", "reason": "t"},
                )
            for wanted in [[1, 1, 2, 3, 2], [3, 3, 3], [2, 1], []]:
                for budget in [0, 1, 2, 10]:
                    got = await statements.claim(
                        conn, queues, keys, wanted=wanted, budget=budget, held=[], releases=[]
                    )
                    flags = [queue in paused or "*" in paused for queue in queues]
                    cursor = await conn.execute(
                        function, ("*" in paused, flags, [None] * 3, keys, wanted, budget)
                    )
                    assert [tuple(row) for row in got] == await cursor.fetchall(), (
                        paused,
                        wanted,
                        budget,
                    )
                    cases += 1
    assert cases == 64
