"""A worker process for the multi-process dispatch tests (run with ``python -m``).

``hold DSN QUEUE POOLER``: take one slot of QUEUE, print ``holding SLOT BACKEND_PID``, then
wait until killed. ``churn DSN QUEUE JOBS POOL POOLER``: print ``ready``, wait for ``go`` on
stdin, then run JOBS jobs through a worker group with the cluster state; each job counts itself
in the table ``probe`` while it runs. Prints ``done N`` at the end. POOLER is the store's
``pooler`` setting (``none``, or ``transaction`` for a DSN through PgBouncer).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import psycopg

from relayer.dispatch import (
    ClaimRequest,
    Job,
    MemoryQueue,
    PostgresClusterState,
    Strict,
    WorkerGroup,
)
from relayer.settings import StoreSettings, store_settings
from tests.integration.dispatch.helpers import server_pid


def store_for(dsn: str, pooler: str) -> StoreSettings:
    return store_settings(name="orders", dsn=dsn, lanes=16, table_prefix="orders_", pooler=pooler)


async def hold(dsn: str, queue: str, pooler: str) -> None:
    async with PostgresClusterState(store_for(dsn, pooler)) as state:
        result = await state.acquire(ClaimRequest((queue,), (0,), 1))
        [grant] = result.grants
        print(f"holding {grant.slot.number} {await server_pid(state)}", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # until the test kills us


async def churn(dsn: str, queue_name: str, jobs: int, pool_size: int, pooler: str) -> None:
    queue: MemoryQueue[int] = MemoryQueue(queue_name)
    for key in range(jobs):
        queue.schedule(key, 0.0)
    finished = 0
    async with (
        PostgresClusterState(store_for(dsn, pooler)) as state,
        await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, prepare_threshold=None
        ) as probe,
    ):
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)

        async def handler(job: Job[Any]) -> None:
            nonlocal finished
            await probe.execute(
                "UPDATE probe SET running = running + 1, "
                "peak = greatest(peak, running + 1), total = total + 1"
            )
            await asyncio.sleep(0.005)  # the job's work: lets the others contend for slots
            await probe.execute("UPDATE probe SET running = running - 1")
            finished += 1
            if finished == jobs:
                group.stop()

        group: WorkerGroup[int] = WorkerGroup(
            Strict(queue_name),
            [queue],
            handler,
            pool_size=pool_size,
            cluster_state=state,
            recheck_interval=0.005,
        )
        await group.run()
    print(f"done {finished}", flush=True)


def main(argv: list[str]) -> None:
    mode, dsn, queue, *rest = argv
    if mode == "hold":
        asyncio.run(hold(dsn, queue, rest[0]))
    else:
        asyncio.run(churn(dsn, queue, int(rest[0]), int(rest[1]), rest[2]))


if __name__ == "__main__":
    main(sys.argv[1:])
