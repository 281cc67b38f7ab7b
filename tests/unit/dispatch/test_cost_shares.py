"""Weighted shares of cost (issue 34, item 24): when handlers return what their jobs cost (the
relay: rows sent by a lane scan), every queue's share of the cost served while all of them
have work follows its weight within 5%, whatever its jobs cost, how many keys (lanes) it has
and how many groups (workers) share its keys."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest

from relayer.dispatch import Job, ManualClock, MemoryQueue, Weighted, WorkerGroup
from relayer.dispatch.planner import Planner


@dataclass(frozen=True)
class Store:
    name: str
    weight: int
    cost: int  # rows a job (a lane scan) sends
    lanes: int
    turns: int = 1  # event-loop turns a job takes


STORES = (
    Store("a", 1, cost=10, lanes=4),
    Store("b", 2, cost=3, lanes=8, turns=2),
    Store("c", 4, cost=20, lanes=4),
    Store("d", 1, cost=1, lanes=12, turns=3),
)
TOTAL = 60_000  # rows served before the run stops: every store keeps a backlog to the end


async def serve(stores: tuple[Store, ...], workers: int, pool_size: int) -> Counter[str]:
    """Rows sent per store by ``workers`` groups, each with its share of every store's lanes
    (lane % workers), every lane always due again (a backlog), until TOTAL rows were sent."""
    sent: Counter[str] = Counter()
    done = asyncio.Event()
    by_name = {store.name: store for store in stores}
    groups = []
    for worker in range(workers):
        queues = {store.name: MemoryQueue[int](store.name) for store in stores}

        def handler_for(
            queues: dict[str, MemoryQueue[int]],
        ) -> Callable[[Job[int]], Awaitable[int]]:
            async def handler(job: Job[int]) -> int:
                store = by_name[job.queue]
                for _ in range(store.turns):
                    await asyncio.sleep(0)
                queues[job.queue].schedule(job.key, 0.0)  # its lane has more rows
                sent[job.queue] += store.cost
                if sum(sent.values()) >= TOTAL:
                    done.set()
                return store.cost

            return handler

        for store in stores:
            for lane in range(worker, store.lanes, workers):
                queues[store.name].schedule(lane, 0.0)
        policy = Weighted([(store.name, store.weight) for store in stores])
        groups.append(
            WorkerGroup(
                policy,
                list(queues.values()),
                handler_for(queues),
                pool_size=pool_size,
                clock=ManualClock(),
            )
        )
    tasks = [asyncio.create_task(group.run()) for group in groups]
    await done.wait()
    for group in groups:
        group.stop()
    await asyncio.gather(*tasks)
    return sent


# The fleet benchmark's shape: 30 stores of 2 lanes, weights 1, 2 and 4 by thirds, batches of
# 10 rows; with two workers each serves one lane of every store.
FLEET = tuple(
    Store(f"t{number:02d}", (1, 2, 4)[number * 3 // 30], cost=10, lanes=2, turns=4)
    for number in range(30)
)


@pytest.mark.parametrize(
    ("stores", "workers", "pool_size"),
    [(STORES, 1, 4), (STORES, 2, 4), (STORES, 3, 4), (FLEET, 1, 8), (FLEET, 2, 8), (FLEET, 2, 16)],
)
async def test_each_queue_gets_its_weight_of_the_rows_whatever_its_jobs_cost(
    stores: tuple[Store, ...], workers: int, pool_size: int
) -> None:
    sent = await serve(stores, workers, pool_size=pool_size)
    total_rows = sum(sent.values())
    total_weight = sum(store.weight for store in stores)
    for store in stores:
        share = sent[store.name] / total_rows
        assert share == pytest.approx(store.weight / total_weight, rel=0.05), (store, sent)


def test_unit_costs_keep_the_documented_sequences() -> None:
    for weights, expected in (((6, 3, 1), "abaabacaba"), ((5, 1, 1), "aabacaa")):
        planner = Planner(Weighted(list(zip("abc", weights, strict=False))))
        order = ""
        for _ in range(len(expected)):
            plan = planner.plan(1, [5, 5, 5])
            planner.charge(list(plan.order[:1]), [1, 1, 1])
            (index,) = plan.order[:1]
            planner.settle(index, 1, planner.cost(index))
            order += "abc"[index]
        assert order == expected


def test_costs_settled_after_the_claim_weigh_the_next_ones() -> None:
    # a and b weigh the same; a's jobs cost 3 rows, b's 1: b is served three times as often.
    planner = Planner(Weighted([("a", 1), ("b", 1)]))
    order = ""
    for _ in range(12):
        plan = planner.plan(1, [5, 5])
        (index,) = plan.order[:1]
        charged = planner.cost(index)
        planner.charge([index], [1, 1])
        planner.settle(index, 3 if index == 0 else 1, charged)
        order += "ab"[index]
    assert order == "abbbabbbabbb"
