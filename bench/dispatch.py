"""Dispatch benchmark: planner decisions/s in memory, and claims/s against PostgreSQL.

    python bench/dispatch.py [--dsn DSN] [--seconds 1.0]

Prints (1) how many slot decisions per second the pure planner makes (plan + charge) for
Weighted 6:3:1, Strict and MaxLen, in passes of 20 free slots and of 1; (2) jobs/s through a
whole in-memory WorkerGroup with empty handlers; (3) claims/s and passes (round trips)/s of
PostgresClusterState for queues without a limit (pause check only) and with a limit (advisory
slot locks taken, and released in the next pass), from 1 and from 4 dispatcher connections;
(4) the CPU of the claim a relay batch transaction makes at a steady rate (one queue, one slot):
this process's and the dispatcher session's, in µs a claim (the session's only when PostgreSQL
runs on this machine).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from bench.common import machine, postgres, scratch_schema, server_version
from bench.cpu import is_local_postgres, process_seconds
from relayer.dispatch import (
    ClaimRequest,
    Job,
    MaxLen,
    MemoryQueue,
    Planner,
    Policy,
    PostgresClusterState,
    QueueControl,
    Strict,
    Weighted,
    WorkerGroup,
)
from relayer.operations import schema
from relayer.settings import StoreSettings, store_settings

BACKLOG = 10**9
SIX_THREE_ONE = Weighted([("a", 6), ("b", 3), ("c", 1)])


def planner_rate(policy: Policy, free: int, seconds: float) -> float:
    """Slot decisions per second of plan() + charge() with every queue backlogged."""
    planner = Planner(policy)
    due = [BACKLOG] * len(policy.queues)
    demand = [free] * len(policy.queues)
    decisions = 0
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(200):
            plan = planner.plan(free, due)
            planner.charge(plan.order, demand)
            decisions += len(plan.order)
    return decisions / elapsed


async def group_rate(jobs: int) -> float:
    """Jobs/s through a WorkerGroup (pool 20, Weighted 6:3:1) with handlers that return at once."""
    queues: list[MemoryQueue[int]] = [MemoryQueue(name) for name in "abc"]
    for queue in queues:
        for key in range(jobs // 3):
            queue.schedule(key, 0.0)
    total = len(queues) * (jobs // 3)
    done = 0

    async def handler(job: Job[int]) -> None:
        nonlocal done
        done += 1
        if done == total:
            group.stop()

    group = WorkerGroup(SIX_THREE_ONE, queues, handler, pool_size=20)
    started = time.perf_counter()
    await group.run()
    return total / (time.perf_counter() - started)


async def claim_rate(
    store: StoreSettings, queues: tuple[str, ...], connections: int, seconds: float
) -> tuple[float, float]:
    """(claims/s, passes/s) of passes of 20 slots, every claim released in the next pass."""
    order = tuple(index for _ in range(20) for index in range(len(queues)))
    request = ClaimRequest(queues, order, 20)
    claims = passes = 0

    async def one() -> None:
        nonlocal claims, passes
        async with PostgresClusterState(store) as state:
            await state.acquire(request)  # warm up: connection, schema check, function
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline:
                result = await state.acquire(request)
                claims += len(result.grants)
                passes += 1
                for grant in result.grants:
                    state.release(grant.slot)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(connections)))
    elapsed = time.perf_counter() - started
    return claims / elapsed, passes / elapsed


async def claim_cost(store: StoreSettings, seconds: float) -> tuple[int, float, float | None]:
    """(claims, client µs a claim, dispatcher session µs a claim or None) for claims of one
    slot of one queue without a limit, one after another: the pass a relay batch transaction
    makes at a steady rate."""
    request = ClaimRequest(("a",), (0,), 1)
    async with PostgresClusterState(store) as state:
        await state.acquire(request)  # warm up: connection, schema check, function
        async with await psycopg.AsyncConnection.connect(
            store.require_dsn(), autocommit=True
        ) as conn:
            cursor = await conn.execute(
                "SELECT pid FROM pg_catalog.pg_stat_activity "
                "WHERE application_name LIKE 'relayer:%%' "
                "AND pg_catalog.strpos(application_name, %s) > 0 "
                "AND pg_catalog.strpos(application_name, ':dispatcher') > 0 "
                "ORDER BY backend_start DESC LIMIT 1",
                (f":{store.name}",),
            )
            row = await cursor.fetchone()
        pid = int(row[0]) if row is not None and is_local_postgres(int(row[0])) else None
        claims = 0
        server_before = process_seconds(pid) if pid is not None else 0.0
        client_before = time.process_time()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            result = await state.acquire(request)
            claims += 1
            for grant in result.grants:
                state.release(grant.slot)
        client = time.process_time() - client_before
        server = process_seconds(pid) - server_before if pid is not None else None
    per = 1e6 / max(claims, 1)
    return claims, client * per, None if server is None else server * per


async def database_figures(dsn: str, schema_name: str, seconds: float) -> None:
    store = store_settings(name="bench", dsn=dsn, schema=schema_name, table_prefix="d_")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await schema.apply(conn, store)
        control = QueueControl(conn, store.names)
        for queue in ("limited_a", "limited_b", "limited_c"):
            await control.set_limit(queue, 1_000)
    for label, queues in (
        ("no limit (pause check only)", ("a", "b", "c")),
        ("limit 1,000 per queue (slot locks)", ("limited_a", "limited_b", "limited_c")),
    ):
        for connections in (1, 4):
            claims, passes = await claim_rate(store, queues, connections, seconds)
            print(
                f"PostgresClusterState, 3 queues, {label}, {connections} connection(s): "
                f"{claims:,.0f} claims/s in {passes:,.0f} passes/s (one round trip each)"
            )
    claims, client, server = await claim_cost(store, max(seconds, 2.0))
    session = "not on this machine" if server is None else f"{server:.0f} µs"
    print(
        f"one claim of one slot (a relay batch transaction's, at a steady rate), {claims:,} "
        f"claims: this process {client:.0f} µs a claim, the dispatcher session {session}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--seconds", type=float, default=1.0)
    arguments = parser.parse_args()
    print(f"machine: {machine()}")
    for name, policy in (
        ("Weighted 6:3:1", SIX_THREE_ONE),
        ("Strict a,b,c", Strict("a", "b", "c")),
        ("MaxLen a,b,c", MaxLen("a", "b", "c")),
    ):
        for free in (20, 1):
            rate = planner_rate(policy, free, arguments.seconds)
            print(f"planner {name}, passes of {free:>2} free slots: {rate:,.0f} decisions/s")
    print(f"WorkerGroup in memory (pool 20, 6:3:1): {asyncio.run(group_rate(60_000)):,.0f} jobs/s")
    with postgres(arguments.dsn) as dsn, scratch_schema(dsn, "dispatch") as schema_name:
        print(server_version(dsn))
        asyncio.run(database_figures(dsn, schema_name, arguments.seconds))


if __name__ == "__main__":
    main()
