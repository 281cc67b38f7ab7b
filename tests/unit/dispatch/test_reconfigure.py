"""Worker groups reconfigured between passes: queues join and leave a running group."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from relayer.dispatch import (
    InvalidDispatchError,
    Job,
    ManualClock,
    MemoryQueue,
    Planner,
    RoundRobin,
    Strict,
    Weighted,
    WorkerGroup,
)
from tests.unit.dispatch.harness import Held, keys, running, settle


def backlog(name: str, size: int) -> MemoryQueue[int]:
    queue: MemoryQueue[int] = MemoryQueue(name)
    for key in range(size):
        queue.schedule(key, 0.0)
    return queue


async def test_a_queue_joins_a_running_group_and_gets_its_share_at_once() -> None:
    """A store with a huge backlog does not keep a newcomer waiting behind it."""
    busy, newcomer = backlog("busy", 20_000), backlog("new", 1_000)
    served: Counter[str] = Counter()
    released = asyncio.Event()

    async def handler(job: Job[int]) -> None:
        served[job.queue] += 1
        await released.wait()

    group = WorkerGroup(Weighted([("busy", 1)]), [busy], handler, pool_size=10, clock=ManualClock())
    async with running(group):
        assert served == {"busy": 10}
        await group.reconfigure(Weighted([("busy", 1), ("new", 3)]), [busy, newcomer])
        assert group.running == 10  # the busy queue's jobs keep their slots
        served.clear()
        released.set()  # every slot frees; the next passes share them 1:3
        for _ in range(50):
            await asyncio.sleep(0)
        total = sum(served.values())
        assert total >= 100
        assert served["new"] / total == pytest.approx(0.75, abs=0.05)
        group.stop()


async def test_a_leaving_queue_keeps_its_running_jobs_accounted_until_they_end() -> None:
    clock = ManualClock()
    a, b = backlog("a", 5), backlog("b", 5)
    held = Held()
    group = WorkerGroup(Weighted([("a", 1), ("b", 1)]), [a, b], held, pool_size=4, clock=clock)
    async with running(group, held):
        assert Counter(job.queue for job in held.started) == {"a": 2, "b": 2}
        await group.reconfigure(Weighted([("a", 1)]), [a])
        assert group.running == 4 and group.free == 0  # b's two jobs still hold slots
        drained = asyncio.ensure_future(group.finished(b))
        await asyncio.sleep(0)
        assert not drained.done()
        held.finish()  # all four end; b's are finished on b, and b gets no new claim
        await drained
        await settle(group, running=3)  # a's three other due jobs
        assert [job.queue for job in held.started[4:]] == ["a", "a", "a"]
        assert b.due_count(clock.now()) == 3 and not b.is_running(0)
        assert [t.queue for t in group.telemetry()] == ["a"]
        assert group.telemetry()[0].served == 5  # kept across the change


async def test_surviving_queues_keep_their_credit_and_counts() -> None:
    policy = Weighted([("a", 6), ("b", 3), ("c", 1)])
    planner = Planner(policy)
    planner.charge([0, 1, 0, 2, 0], [5, 5, 5])
    carried = planner.carried_to(Weighted([("b", 3), ("a", 6), ("d", 2)]))
    before = dict(zip("abc", planner.credits, strict=True))
    assert carried.credits == (before["b"], before["a"], 0)
    capped = Planner(Weighted([("a", 100), ("b", 1)]))
    capped.charge([1], [0, 1])  # a, without due work, banks its weight
    assert capped.credits == (100, 0)
    assert capped.carried_to(Weighted([("a", 1), ("z", 1)])).credits == (2, 0)  # at most T
    cursor = Planner(RoundRobin("a", "b", "c"))
    cursor.charge([0], [1, 1, 1])  # next: b
    assert cursor.carried_to(RoundRobin("c", "b")).plan(2, [1, 1]).order == (1, 0)


async def test_a_group_with_no_policy_serves_nothing_until_given_queues() -> None:
    clock = ManualClock()
    held = Held()
    group: WorkerGroup[int] = WorkerGroup(None, [], held, clock=clock)
    async with running(group, held):
        assert group.last_pass is not None and group.last_pass.claimed == ()
        assert group.telemetry() == ()
        queue = backlog("a", 2)
        waiter = group.next_pass()
        await group.reconfigure(Strict("a"), [queue])
        await waiter
        await settle(group, running=2)
        assert keys(held.started) == [0, 1]
        await group.reconfigure(None, [])
        assert group.running == 2
    with pytest.raises(InvalidDispatchError, match="serves queues"):
        await group.reconfigure(None, [queue])


async def test_a_bad_reconfiguration_is_refused_and_changes_nothing() -> None:
    a = backlog("a", 1)
    group = WorkerGroup(Strict("a"), [a], Held())
    with pytest.raises(InvalidDispatchError, match="two sources named 'a'"):
        await group.reconfigure(Strict("a"), [a, a])
    with pytest.raises(InvalidDispatchError, match="at least one queue, all weights >= 1"):
        await group.reconfigure(Weighted([("a", 0)]), [a])
    assert group.policy == Strict("a")
