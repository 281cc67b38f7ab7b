"""The pure planner: pinned sequences, exact long-run shares, reflow and cut-short passes."""

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relayer.dispatch import MaxLen, MinLen, Planner, Policy, Priority, RoundRobin, Strict, Weighted
from relayer.dispatch.planner import swrr_step

SIX_THREE_ONE = Weighted([("a", 6), ("b", 3), ("c", 1)])
BACKLOG = 10**9


def one_slot_at_a_time(policy: Policy, due: Sequence[int], steps: int) -> list[str]:
    """Claims one job per pass, reading the backlogs again each time (varmq's programs)."""
    planner = Planner(policy)
    left = list(due)
    served: list[str] = []
    for _ in range(steps):
        plan = planner.plan(1, left)
        if not plan.order:
            break
        index = plan.order[0]
        planner.charge([index], [min(count, 1) for count in left])
        left[index] -= 1
        served.append(policy.queues[index])
    return served


def test_six_three_one_repeats_its_period() -> None:
    pattern = ["a", "b", "a", "a", "b", "a", "c", "a", "b", "a"]
    assert one_slot_at_a_time(SIX_THREE_ONE, [BACKLOG] * 3, 30) == pattern * 3


def test_five_one_one() -> None:
    policy = Weighted([("a", 5), ("b", 1), ("c", 1)])
    pattern = ["a", "a", "b", "a", "c", "a", "a"]
    assert one_slot_at_a_time(policy, [BACKLOG] * 3, 21) == pattern * 3


def test_a_pass_of_ten_slots_is_the_same_sequence() -> None:
    plan = Planner(SIX_THREE_ONE).plan(10, [BACKLOG] * 3)
    assert [SIX_THREE_ONE.queues[i] for i in plan.order] == [
        "a",
        "b",
        "a",
        "a",
        "b",
        "a",
        "c",
        "a",
        "b",
        "a",
    ]
    assert plan.allocation == (6, 3, 1)


def test_a_thousand_opportunities_give_exactly_600_300_100() -> None:
    assert Counter(one_slot_at_a_time(SIX_THREE_ONE, [BACKLOG] * 3, 1000)) == {
        "a": 600,
        "b": 300,
        "c": 100,
    }
    planner = Planner(SIX_THREE_ONE)
    served: Counter[int] = Counter()
    for _ in range(100):  # the same in passes of 7 slots
        plan = planner.plan(7, [BACKLOG] * 3)
        served.update(plan.order)
        planner.charge(plan.order, [7, 7, 7])
    planner_total = Counter({SIX_THREE_ONE.queues[i]: n for i, n in served.items()})
    assert planner_total == {"a": 420, "b": 210, "c": 70}


def test_same_schedule_on_every_run() -> None:
    runs = {tuple(one_slot_at_a_time(SIX_THREE_ONE, [BACKLOG] * 3, 200)) for _ in range(5)}
    assert len(runs) == 1


VARMQ = ("alerts", "reports", "emails")


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (
            Priority(("alerts", 1), ("reports", 2), "emails"),
            "alert alert report email email email",
        ),
        (RoundRobin(*VARMQ), "alert report email alert email email"),
        (MaxLen(*VARMQ), "email alert email alert report email"),
        (MinLen(*VARMQ), "report alert alert email email email"),
    ],
)
def test_varmq_example_orders(policy: Policy, expected: str) -> None:
    served = one_slot_at_a_time(policy, [2, 1, 3], 10)
    assert [name.rstrip("s") for name in served] == expected.split()


def test_varmq_orders_hold_within_one_pass_too() -> None:
    for policy, expected in [
        (MaxLen(*VARMQ), [2, 0, 2, 0, 1, 2]),
        (MinLen(*VARMQ), [1, 0, 0, 2, 2, 2]),
        (RoundRobin(*VARMQ), [0, 1, 2, 0, 2, 2]),
    ]:
        assert list(Planner(policy).plan(6, [2, 1, 3]).order) == expected


def test_priority_puts_unranked_last_and_keeps_list_order_for_equal_ranks() -> None:
    policy = Priority("late", ("x", 2), ("y", 1), ("z", 2))
    assert policy.order() == (2, 1, 3, 0)
    assert Planner(policy).plan(4, [1, 1, 1, 1]).order == (2, 1, 3, 0)


def test_strict_fills_from_the_first_queue_with_work() -> None:
    planner = Planner(Strict("hi", "mid", "lo"))
    assert planner.plan(5, [2, 0, 9]).order == (0, 0, 2, 2, 2)
    assert planner.plan(5, [2, 0, 9]).allocation == (2, 0, 3)
    assert planner.plan(5, [2, 0, 9], overflow=True).order == (0, 0, 2, 2, 2, 2, 2)


def test_no_free_slot_plans_nothing() -> None:
    for policy in (SIX_THREE_ONE, Strict("a", "b", "c")):
        plan = Planner(policy).plan(0, [5, 5, 5])
        assert plan.order == () and plan.allocation == (0, 0, 0)


def run_passes(
    planner: Planner, passes: int, free: int, due: Sequence[int], cut_every: int = 0
) -> Counter[int]:
    served: Counter[int] = Counter()
    for number in range(passes):
        plan = planner.plan(free, due)
        issued = list(plan.order)
        if cut_every and number % cut_every == 0:
            # Cut short after the first queue's batch: BackWave charges the whole plan here.
            issued = sorted(issued)[: len(issued) // 2]
        served.update(issued)
        planner.charge(issued, [min(count, free) for count in due])
    return served


def test_reflow_by_weight_when_a_is_always_empty() -> None:
    """BackWave reflows a's share in declaration order (b:c = 9:1); relayer by weight."""
    served = run_passes(Planner(SIX_THREE_ONE), 1_000, 10, [0, BACKLOG, BACKLOG])
    assert sum(served.values()) == 10_000
    assert served[0] == 0
    assert served[1] / served[2] == pytest.approx(3.0, rel=0.01)


def test_one_pass_in_four_cut_short_keeps_exact_shares() -> None:
    """BackWave drifts to 0.66/0.26/0.08; charging issued claims only keeps 0.6/0.3/0.1."""
    served = run_passes(Planner(SIX_THREE_ONE), 4_000, 10, [BACKLOG] * 3, cut_every=4)
    total = sum(served.values())
    assert total > 10_000
    for index, share in enumerate((0.6, 0.3, 0.1)):
        assert served[index] / total == pytest.approx(share, abs=0.01)


def test_prefix_cuts_keep_exact_shares_too() -> None:
    planner = Planner(SIX_THREE_ONE)
    served: Counter[int] = Counter()
    for number in range(4_000):
        plan = planner.plan(10, [BACKLOG] * 3)
        issued = plan.order[:3] if number % 4 == 0 else plan.order
        served.update(issued)
        planner.charge(issued, [10, 10, 10])
    total = sum(served.values())
    for index, share in enumerate((0.6, 0.3, 0.1)):
        assert served[index] / total == pytest.approx(share, abs=0.01)


def test_a_short_queue_reflows_within_the_pass_in_proportion() -> None:
    plan = Planner(SIX_THREE_ONE).plan(10, [2, BACKLOG, BACKLOG])
    assert plan.allocation[0] == 2
    assert plan.allocation[1] == 6 and plan.allocation[2] == 2  # 8 slots split 3:1


def test_overflow_order_lets_a_refused_queue_reflow() -> None:
    plan = Planner(SIX_THREE_ONE).plan(8, [BACKLOG] * 3, overflow=True)
    assert len(plan.order) == 24
    without_a = [index for index in plan.order if index != 0][:8]
    assert Counter(without_a) == {1: 6, 2: 2}


def test_an_idle_queue_banks_a_bounded_credit() -> None:
    planner = Planner(SIX_THREE_ONE)
    for _ in range(10_000):
        plan = planner.plan(10, [0, BACKLOG, BACKLOG])
        planner.charge(plan.order, [0, 10, 10])
    assert planner.credits[0] == SIX_THREE_ONE.total  # capped at T, not 60,000
    plan = planner.plan(10, [BACKLOG] * 3)
    assert plan.allocation[0] <= 8  # a bounded catch-up, not the whole pass


def test_credits_stay_bounded_under_random_cuts() -> None:
    planner = Planner(SIX_THREE_ONE)
    for number in range(5_000):
        plan = planner.plan(1 + number % 13, [BACKLOG] * 3)
        issued = plan.order[: number % 5]
        planner.charge(issued, [1 + number % 13] * 3)
        assert all(abs(credit) <= 4 * SIX_THREE_ONE.total for credit in planner.credits)


POLICIES: list[Policy] = [
    Strict("a", "b", "c"),
    Weighted([("a", 6), ("b", 3), ("c", 1)]),
    Weighted([("a", 1), ("b", 1), ("c", 5)]),
    Priority(("a", 2), "b", ("c", 1)),
    RoundRobin("a", "b", "c"),
    MaxLen("a", "b", "c"),
    MinLen("a", "b", "c"),
]


@given(
    policy=st.sampled_from(POLICIES),
    passes=st.lists(
        st.tuples(st.integers(0, 25), st.lists(st.integers(0, 30), min_size=3, max_size=3)),
        min_size=1,
        max_size=20,
    ),
)
def test_every_free_slot_goes_to_due_work(
    policy: Policy, passes: list[tuple[int, list[int]]]
) -> None:
    """Work conservation: a plan fills min(free, due work) slots, never more than is due."""
    planner = Planner(policy)
    for free, due in passes:
        plan = planner.plan(free, due)
        assert sum(plan.allocation) == min(free, sum(due))
        assert all(plan.allocation[i] <= due[i] for i in range(3))
        full = planner.plan(free, due, overflow=True)
        assert Counter(full.order) == {
            i: min(free, due[i]) for i in range(3) if min(free, due[i]) > 0
        }
        planner.charge(plan.order, [min(count, free) for count in due])


def replay(
    credits: list[int], weights: list[int], issued: list[int], demand: list[int]
) -> list[int]:
    """The reference charge: one SWRR step per issued claim, won by the queue that served; a
    queue served all it could take in the pass has a job running: busy (it grows and pays in
    like a queue with work, up to its cap), not idle."""
    credits = list(credits)
    totals = [issued.count(q) for q in range(len(weights))]
    limits = [max(demand[q], totals[q]) for q in range(len(weights))]
    served = [0] * len(weights)
    for index in issued:
        eligible = [served[q] < limits[q] for q in range(len(weights))]
        running = [served[q] > 0 for q in range(len(weights))]
        swrr_step(credits, weights, eligible, sum(weights), index, busy=running)
        served[index] += 1
    return credits


@given(
    weights=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    data=st.data(),
)
def test_charging_equals_one_step_per_issued_claim(weights: list[int], data: st.DataObject) -> None:
    count = len(weights)
    credits = data.draw(st.lists(st.integers(-40, 10), min_size=count, max_size=count))
    issued = data.draw(st.lists(st.integers(0, count - 1), max_size=15))
    demand = data.draw(st.lists(st.integers(0, 15), min_size=count, max_size=count))
    planner = Planner(Weighted([(str(q), weight) for q, weight in enumerate(weights)]))
    planner._credits = list(credits)
    planner.charge(issued, demand)
    assert list(planner.credits) == replay(credits, weights, issued, demand)
