"""Fairness of whole worker groups where BackWave's design fails, and work conservation."""

import asyncio
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relayer.dispatch import (
    ClaimRequest,
    ClaimResult,
    GateState,
    Job,
    ManualClock,
    MaxLen,
    MemoryClusterState,
    MemoryQueue,
    MinLen,
    Policy,
    Priority,
    RoundRobin,
    RoutedClusterState,
    Slot,
    Strict,
    Weighted,
    WorkerGroup,
)
from relayer.dispatch.planner import Planner
from tests.unit.dispatch.harness import Held, running, settle

SIX_THREE_ONE = Weighted([("a", 6), ("b", 3), ("c", 1)])


class ShortSource(MemoryQueue[int]):
    """A queue whose every fourth claim is cut short (another consumer got there first)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.claims = 0

    def claim(self, now: float, limit: int) -> list[Job[int]]:
        self.claims += 1
        return super().claim(now, max(0, limit // 2) if self.claims % 4 == 0 else limit)


async def serve(
    policy: Policy,
    queues: list[MemoryQueue[int]],
    total: int,
    cluster: Any = None,
    pool_size: int = 10,
) -> Counter[str]:
    """Run a group with instant handlers until it has served ``total`` jobs."""
    served: Counter[str] = Counter()
    finished = asyncio.Event()

    async def handler(job: Job[int]) -> None:
        served[job.queue] += 1
        if sum(served.values()) >= total:
            finished.set()

    group = WorkerGroup(
        policy, queues, handler, pool_size=pool_size, cluster_state=cluster, clock=ManualClock()
    )
    task = asyncio.create_task(group.run())
    await finished.wait()
    group.stop()
    await task
    assert sum(served.values()) >= total
    return served


def backlog(queue: MemoryQueue[int], size: int) -> MemoryQueue[int]:
    for key in range(size):
        queue.schedule(key, 0.0)
    return queue


async def test_an_always_empty_queue_reflows_by_weight() -> None:
    queues = [
        MemoryQueue[int]("a"),
        backlog(MemoryQueue("b"), 20_000),
        backlog(MemoryQueue("c"), 20_000),
    ]
    served = await serve(SIX_THREE_ONE, queues, 10_000)
    assert served["a"] == 0
    assert served["b"] / served["c"] == pytest.approx(3.0, rel=0.01)


async def test_a_paused_queue_reflows_by_weight() -> None:
    gate = MemoryClusterState()
    gate.pause("a")
    queues = [backlog(MemoryQueue(name), 20_000) for name in "abc"]
    served = await serve(SIX_THREE_ONE, queues, 10_000, cluster=gate)
    assert served["a"] == 0
    assert served["b"] / served["c"] == pytest.approx(3.0, rel=0.01)


async def test_passes_cut_short_keep_the_long_run_shares() -> None:
    queues: list[MemoryQueue[int]] = [backlog(ShortSource(name), 20_000) for name in "abc"]
    served = await serve(SIX_THREE_ONE, queues, 10_000)
    total = sum(served.values())
    for name, share in zip("abc", (0.6, 0.3, 0.1), strict=True):
        assert served[name] / total == pytest.approx(share, abs=0.01)


async def test_a_concurrency_limit_caps_a_queue_and_its_share_reflows() -> None:
    gate = MemoryClusterState()
    gate.set_limit("a", 2)
    clock = ManualClock()
    queues = [backlog(MemoryQueue(name), 100) for name in "abc"]
    held = Held()
    group = WorkerGroup(SIX_THREE_ONE, queues, held, pool_size=10, cluster_state=gate, clock=clock)
    async with running(group, held):
        assert group.last_pass is not None
        assert group.last_pass.claimed == (2, 6, 2)  # a's other 4 slots split 3:1
        assert group.last_pass.gates[0] is GateState.FULL
        assert gate.in_use("a") == 2
        held.finish(1)  # one of a's jobs ends: its slot goes back to the gate
        await settle(group, running=10)
        assert gate.in_use("a") == 2


async def test_a_refused_queue_with_due_work_is_looked_at_again_later() -> None:
    gate = MemoryClusterState()
    gate.set_limit("a", 2)
    clock = ManualClock()
    queues = [backlog(MemoryQueue("a"), 100), backlog(MemoryQueue("b"), 2)]
    held = Held()
    policy = Weighted([("a", 1), ("b", 1)])
    group = WorkerGroup(policy, queues, held, cluster_state=gate, clock=clock)
    async with running(group, held):
        assert group.last_pass is not None and group.last_pass.claimed == (2, 2)
        assert clock.next_deadline == group.recheck_interval
        gate.set_limit("a", 3)  # nothing tells the group: it finds out when it looks again
        waiter = group.next_pass()
        clock.advance(group.recheck_interval)
        assert (await waiter).claimed == (1, 0)


async def test_routed_state_sends_each_queue_to_its_own_gate() -> None:
    orders, billing = MemoryClusterState(), MemoryClusterState()
    orders.pause("orders")
    billing.set_limit("billing", 1)
    routed = RoutedClusterState({"orders": orders, "billing": billing})
    request = ClaimRequest(("orders", "billing", "other"), (0, 1, 1, 2, 0, 2), 3)
    result: ClaimResult = await routed.acquire(request)
    assert [(g.position, g.queue_index) for g in result.grants] == [(1, 1), (3, 2), (5, 2)]
    assert [gate.state for gate in result.gates] == [
        GateState.PAUSED,
        GateState.FULL,
        GateState.OPEN,
    ]
    assert billing.in_use("billing") == 1
    routed.release(Slot("billing", 0))
    assert billing.in_use("billing") == 0


class CountingGate(MemoryClusterState):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    async def acquire(self, request: ClaimRequest) -> ClaimResult:
        self.asked += 1
        return await super().acquire(request)


async def test_routed_state_asks_only_the_gates_of_queues_the_claim_wants() -> None:
    """A worker serving hundreds of stores pays no round trip to the gates of stores without
    due work; their queues are reported as their gate last answered."""
    orders, billing = CountingGate(), CountingGate()
    billing.pause("billing")
    routed = RoutedClusterState({"orders": orders, "billing": billing})
    both = await routed.acquire(ClaimRequest(("orders", "billing"), (0, 1), 2))
    assert (orders.asked, billing.asked) == (1, 1)
    only_orders = await routed.acquire(ClaimRequest(("orders", "billing"), (0, 0), 2))
    assert (orders.asked, billing.asked) == (2, 1)
    assert [gate.state for gate in only_orders.gates] == [GateState.OPEN, GateState.PAUSED]
    assert [grant.queue_index for grant in only_orders.grants] == [0, 0]
    assert [gate.state for gate in both.gates] == [GateState.OPEN, GateState.PAUSED]


async def test_routed_state_asks_only_the_gates_of_the_entries_it_can_grant() -> None:
    """Two free slots, an order over fifty stores: two gates are asked; a refusal asks the
    gate of the next entry (and no further), and the order is read no further than that."""
    names = [f"s{number:02}" for number in range(50)]
    gates = {name: CountingGate() for name in names}
    gates["s00"].pause("s00")
    routed = RoutedClusterState(dict(gates))
    planned = Planner(Weighted([(name, 1) for name in names])).plan(2, [3] * 50, overflow=True)
    result = await routed.acquire(ClaimRequest(tuple(names), planned.order, 2))
    asked = [name for name in names if gates[name].asked]
    assert asked == ["s00", "s01", "s02"]
    assert [names[grant.queue_index] for grant in result.grants] == ["s01", "s02"]
    assert result.gates[0].state is GateState.PAUSED
    assert len(planned.order._entries) == 3  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(
    queues=st.integers(1, 6),
    order=st.lists(st.integers(0, 5), max_size=24),
    budget=st.integers(0, 8),
    paused=st.sets(st.integers(0, 5)),
    limits=st.dictionaries(st.integers(0, 5), st.integers(1, 3)),
)
def test_routed_state_grants_what_one_gate_for_every_queue_grants(
    queues: int, order: list[int], budget: int, paused: set[int], limits: dict[int, int]
) -> None:
    """Asking the gates entry by entry, as far as the slots go, grants exactly what asking one
    gate that holds every queue's pause and limit for the whole order grants."""
    names = tuple(f"q{index}" for index in range(queues))
    entries = tuple(index for index in order if index < queues)

    def configure(gate: MemoryClusterState, index: int) -> None:
        if index in paused:
            gate.pause(names[index])
        if index in limits:
            gate.set_limit(names[index], limits[index])

    single = MemoryClusterState()
    own = {name: MemoryClusterState() for name in names}
    for index, name in enumerate(names):
        configure(single, index)
        configure(own[name], index)
    request = ClaimRequest(names, entries, budget)
    expected = asyncio.run(single.acquire(request))
    routed = asyncio.run(RoutedClusterState(dict(own)).acquire(request))
    assert [(g.position, g.queue_index) for g in routed.grants] == [
        (g.position, g.queue_index) for g in expected.grants
    ]


POLICIES: list[Policy] = [
    Strict("a", "b", "c"),
    SIX_THREE_ONE,
    Priority("a", ("b", 1), ("c", 1)),
    RoundRobin("a", "b", "c"),
    MaxLen("a", "b", "c"),
    MinLen("a", "b", "c"),
]
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.integers(0, 2), st.integers(0, 40), st.integers(-3, 5)),
        st.tuples(st.just("advance"), st.integers(1, 4)),
        st.tuples(st.just("finish"), st.integers(1, 6)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), pool_size=st.integers(1, 6), operations=OPERATIONS)
def test_a_free_slot_never_idles_while_a_served_queue_has_due_work(
    policy: Policy, pool_size: int, operations: list[tuple[Any, ...]]
) -> None:
    asyncio.run(check_work_conservation(policy, pool_size, operations))


async def check_work_conservation(
    policy: Policy, pool_size: int, operations: list[tuple[Any, ...]]
) -> None:
    clock = ManualClock()
    queues: list[MemoryQueue[int]] = [MemoryQueue(name) for name in "abc"]
    held = Held()
    group = WorkerGroup(policy, queues, held, pool_size=pool_size, clock=clock)
    async with running(group, held):
        for operation in operations:
            if operation[0] == "schedule":
                _, index, key, offset = operation
                queues[index].schedule(key, clock.now() + offset)
            elif operation[0] == "advance":
                clock.advance(operation[1])
            else:
                held.finish(operation[1])
            await settle(group, running=min(group.running, held.holding))
            due = sum(queue.due_count(clock.now()) for queue in queues)
            assert group.running <= pool_size  # backpressure
            assert group.free == 0 or due == 0  # work conservation
