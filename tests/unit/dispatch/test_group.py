"""Worker groups on a manual clock: backpressure, wake-ups, failures, telemetry, stopping."""

import asyncio
import logging
from typing import Any

import pytest

from relayer.dispatch import (
    GateState,
    Job,
    ManualClock,
    MemoryQueue,
    Strict,
    Weighted,
    WorkerGroup,
)
from relayer.errors import UsageError
from tests.unit.dispatch.harness import Held, keys, running, settle


def make_queues(*names: str) -> list[MemoryQueue[int]]:
    return [MemoryQueue(name) for name in names]


async def test_a_full_pool_claims_nothing() -> None:
    clock = ManualClock()
    [queue] = make_queues("default")
    held = Held()
    group = WorkerGroup(Strict("default"), [queue], held, pool_size=2, clock=clock)
    for key in range(5):
        queue.schedule(key, 0.0)
    async with running(group, held):
        assert group.last_pass is not None and group.last_pass.claimed == (2,)
        assert keys(held.started) == [0, 1]
        waiter = group.next_pass()
        queue.schedule(99, -5.0)  # earlier than everything: wakes the group
        report = await waiter
        assert report.free == 0 and report.claimed == (0,)
        assert held.holding == 2
        held.finish(1)
        await settle(group, running=2)
        assert keys(held.started) == [0, 1, 99]


async def test_claims_only_into_free_slots() -> None:
    clock = ManualClock()
    [queue] = make_queues("q")
    held = Held()
    group = WorkerGroup(Strict("q"), [queue], held, pool_size=5, clock=clock)
    for key in range(3):
        queue.schedule(key, 0.0)
    async with running(group, held):
        assert group.running == 3 and group.free == 2
        for key in range(3, 10):
            queue.schedule(key, 0.0)
        await settle(group, running=5)
        assert group.free == 0 and queue.due_count(clock.now()) == 5


async def test_strict_prefers_the_first_queue_in_one_pass() -> None:
    clock = ManualClock()
    high, low = make_queues("high", "low")
    held = Held()
    for key in range(3):
        high.schedule(key, 0.0)
        low.schedule(key + 10, 0.0)
    group = WorkerGroup(Strict("high", "low"), [high, low], held, pool_size=4, clock=clock)
    async with running(group, held):
        assert group.last_pass is not None and group.last_pass.claimed == (3, 1)
        assert keys(held.started) == [0, 1, 2, 10]


async def test_wakes_when_the_earliest_job_becomes_due() -> None:
    clock = ManualClock()
    [queue] = make_queues("q")
    held = Held()
    group = WorkerGroup(Strict("q"), [queue], held, clock=clock)
    queue.schedule(1, 30.0)
    queue.schedule(2, 10.0)
    async with running(group, held):
        assert held.started == []
        assert clock.next_deadline == 10.0
        waiter = group.next_pass()
        clock.advance(10.0)
        assert (await waiter).claimed == (1,)
        assert keys(held.started) == [2]
        assert clock.next_deadline == 30.0


async def test_wakes_when_a_job_is_scheduled_earlier() -> None:
    clock = ManualClock()
    [queue] = make_queues("q")
    held = Held()
    group = WorkerGroup(Strict("q"), [queue], held, clock=clock)
    queue.schedule(7, 60.0)
    async with running(group, held):
        waiter = group.next_pass()
        queue.schedule(7, clock.now())  # a NOTIFY: the lane's scan moves to now
        assert (await waiter).claimed == (1,)
        assert clock.now() == 0.0


async def test_a_key_scheduled_while_running_runs_again_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    [queue] = make_queues("q")
    held = Held()
    group = WorkerGroup(Strict("q"), [queue], held, clock=clock)
    queue.schedule(3, 0.0)
    async with running(group, held):
        queue.schedule(3, 0.0)
        await settle(group, running=1)
        assert len(held.started) == 1  # never twice at once
        held.finish()
        await settle(group, running=1)
        assert keys(held.started) == [3, 3]


async def test_a_failing_handler_is_logged_and_the_group_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    [queue] = make_queues("q")
    done: list[int] = []

    async def handler(job: Job[int]) -> None:
        if job.key == 1:
            raise RuntimeError("boom")
        done.append(job.key)

    group = WorkerGroup(Strict("q"), [queue], handler, pool_size=1, clock=clock)
    queue.schedule(1, 0.0)
    queue.schedule(2, 0.0)
    with caplog.at_level(logging.ERROR, logger="relayer.dispatch.group"):
        async with running(group):
            await settle(group, running=0)
            await settle(group, running=0)
    assert done == [2]
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "handler failed for job 1 of queue 'q'" in record.getMessage()
    assert record.exc_info is not None and "boom" in str(record.exc_info[1])
    assert getattr(record, "action", None) == "job_failed"
    assert getattr(record, "queue", None) == "q"


async def test_stop_lets_running_handlers_finish() -> None:
    clock = ManualClock()
    [queue] = make_queues("q")
    held = Held()
    group = WorkerGroup(Strict("q"), [queue], held, clock=clock)
    queue.schedule(1, 0.0)
    first = group.next_pass()
    task = asyncio.create_task(group.run())
    await first
    group.stop()
    await asyncio.sleep(0)
    assert not task.done()  # the job is still running
    queue.schedule(2, 0.0)  # nothing new is claimed while stopping
    held.finish()
    await task
    assert keys(held.started) == [1] and held.finished == 1
    assert queue.due_count(clock.now()) == 1


async def test_run_twice_at_once_is_refused() -> None:
    clock = ManualClock()
    group = WorkerGroup(Strict("q"), make_queues("q"), Held(), clock=clock)
    async with running(group):
        with pytest.raises(UsageError, match="already running"):
            await group.run()


async def test_groups_run_side_by_side_in_one_process() -> None:
    clock = ManualClock()
    a, b, c, d = make_queues("a", "b", "c", "d")
    strict_held, weighted_held = Held(), Held()
    strict = WorkerGroup(Strict("a", "b"), [a, b], strict_held, pool_size=3, clock=clock)
    weighted = WorkerGroup(
        Weighted([("c", 2), ("d", 1)]), [c, d], weighted_held, pool_size=3, clock=clock
    )
    for key in range(10):
        for queue in (a, b, c, d):
            queue.schedule(key, 0.0)
    async with running(strict, strict_held), running(weighted, weighted_held):
        assert [job.queue for job in strict_held.started] == ["a", "a", "a"]
        assert sorted(job.queue for job in weighted_held.started) == ["c", "c", "d"]


async def test_telemetry_reports_service_shares_and_oldest_due_age() -> None:
    clock = ManualClock(100.0)
    a, b = make_queues("a", "b")
    held = Held()
    group = WorkerGroup(Weighted([("a", 3), ("b", 1)]), [a, b], held, pool_size=4, clock=clock)
    for key in range(10):
        a.schedule(key, 90.0)
        b.schedule(key, 95.0)
    async with running(group, held):
        clock.advance(1.0)
        a_stats, b_stats = group.telemetry()
    assert (a_stats.queue, a_stats.served, b_stats.served) == ("a", 3, 1)
    assert a_stats.share == 0.75 and a_stats.configured_share == 0.75
    assert b_stats.share == 0.25 and b_stats.configured_share == 0.25
    assert a_stats.oldest_due_age == 11.0 and b_stats.oldest_due_age == 6.0
    assert a_stats.running == 3 and a_stats.gate is GateState.OPEN
    empty = WorkerGroup(Strict("x"), make_queues("x"), held, clock=clock)
    [x] = empty.telemetry()
    assert (x.served, x.share, x.configured_share, x.oldest_due_age, x.gate) == (
        0,
        0.0,
        None,
        0.0,
        None,
    )


async def test_the_monotonic_clock_wakes_a_real_group() -> None:
    queue: MemoryQueue[int] = MemoryQueue("q")
    done = asyncio.Event()

    async def handler(job: Job[Any]) -> None:
        done.set()

    group = WorkerGroup(Strict("q"), [queue], handler)
    task = asyncio.create_task(group.run())
    queue.schedule(1, 0.0)  # the monotonic clock is far past 0: due at once
    async with asyncio.timeout(10):
        await done.wait()
    group.stop()
    await task


async def test_a_stop_before_run_makes_run_return_at_once() -> None:
    from relayer.dispatch import MemoryQueue, Strict, WorkerGroup

    async def handler(job: object) -> None:
        raise AssertionError("no job may run")

    queue: MemoryQueue[int] = MemoryQueue("q")
    queue.schedule(1, 0.0)
    group = WorkerGroup(Strict("q"), [queue], handler, pool_size=1)
    group.stop()
    await asyncio.wait_for(group.run(), 2)
    assert len(queue) == 1
