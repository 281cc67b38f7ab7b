"""Cluster-wide state across OS processes: exact limits, killed holders, pause from afar."""

import asyncio
import signal

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
    WorkerGroup,
)
from relayer.settings import StoreSettings
from tests.integration.dispatch.helpers import (
    read_line,
    relayer_cli,
    slots_in_use,
    start_worker,
    wait_for_backend_exit,
)
from tests.integration.pgbouncer.helpers import pooled
from tests.unit.dispatch.harness import Held, running


@pytest.fixture(params=["direct", "pgbouncer"])
def gated(request: pytest.FixtureRequest, store: StoreSettings) -> StoreSettings:
    """The store as the worker processes' gates reach it: directly, or through PgBouncer
    pooling by transaction (8 server connections: each process holding a slot keeps one)."""
    if request.param == "direct":
        return store
    return pooled(store, request.getfixturevalue(request.param))


PROCESSES = 4
JOBS_EACH = 12


async def test_four_processes_never_run_more_than_the_limit(
    store: StoreSettings, gated: StoreSettings
) -> None:
    dsn = store.require_dsn()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("CREATE TABLE probe (running int, peak int, total int)")
        await conn.execute("INSERT INTO probe VALUES (0, 0, 0)")
        await QueueControl(conn, store.names).set_limit("shared", 3)
    workers = [
        start_worker("churn", gated.require_dsn(), "shared", str(JOBS_EACH), "3", gated.pooler)
        for _ in range(PROCESSES)
    ]
    try:
        for worker in workers:
            assert await read_line(worker) == "ready"
        for worker in workers:  # all start together, each with room for 3 jobs
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        for worker in workers:
            assert await read_line(worker) == f"done {JOBS_EACH}"
            assert await asyncio.to_thread(worker.wait) == 0
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT running, peak, total FROM probe")
        running_now, peak, total = await cursor.fetchone() or (None, None, None)
    assert total == PROCESSES * JOBS_EACH
    assert running_now == 0
    assert 1 <= peak <= 3  # counted by the database, at the moment each job began


async def test_a_killed_holders_slot_is_claimable_on_the_next_pass(
    store: StoreSettings, gated: StoreSettings
) -> None:
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as c:
        await QueueControl(c, store.names).set_limit("q", 1)
    holder = start_worker("hold", gated.require_dsn(), "q", gated.pooler)
    try:
        word, slot, pid = (await read_line(holder)).split()
        assert (word, slot) == ("holding", "0")
        async with PostgresClusterState(gated) as state:
            refused = await state.acquire(ClaimRequest(("q",), (0,), 1))
            assert refused.grants == () and refused.gates[0].state is GateState.FULL
            holder.send_signal(signal.SIGKILL)
            await asyncio.to_thread(holder.wait)
            # PostgreSQL saw the connection die (behind PgBouncer: PgBouncer closed the server
            # connection of a client that left in the middle of a transaction).
            await wait_for_backend_exit(store, int(pid))
            [grant] = (await state.acquire(ClaimRequest(("q",), (0,), 1))).grants
            assert grant.slot.number == 0
            assert await slots_in_use(store, "q") == 1
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


async def test_a_pause_from_another_process_stops_claims_on_the_next_pass(
    store: StoreSettings,
) -> None:
    queue: MemoryQueue[int] = MemoryQueue("orders")
    held = Held()
    async with PostgresClusterState(store) as state:
        group = WorkerGroup(
            Strict("orders"), [queue], held, cluster_state=state, clock=ManualClock()
        )
        async with running(group, held):
            relayer_cli(store, "queue", "pause", "orders", "--reason", "incident 7", "--by", "pat")
            waiter = group.next_pass()
            queue.schedule(1, 0.0)
            paused = await waiter
            assert paused.claimed == (0,) and paused.gates == (GateState.PAUSED,)
            relayer_cli(store, "queue", "resume", "orders", "--by", "pat")
            waiter = group.next_pass()
            group.wake()  # the recheck timer, without waiting for it
            resumed = await waiter
            assert resumed.claimed == (1,) and resumed.gates == (GateState.OPEN,)
            relayer_cli(store, "queue", "pause", "orders", "--all", "--by", "pat")
            waiter = group.next_pass()
            queue.schedule(2, 0.0)
            assert (await waiter).gates == (GateState.PAUSED,)
            assert [job.key for job in held.started] == [1]
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        events = await QueueControl(conn, store.names).events()
    assert [(e.queue, e.action, e.actor, e.reason) for e in reversed(events)] == [
        ("orders", "pause", "pat", "incident 7"),
        ("orders", "resume", "pat", None),
        ("*", "pause", "pat", None),
    ]
