"""The planner: which queue each free slot of a pass goes to. Pure: no I/O, no clock.

A pass gives the planner the number of free slots and each queue's count of due jobs; the
planner answers with a preference *order*, a sequence of queue indices. Granting the first
``free`` entries of the order is the pass's allocation. With ``overflow`` the order goes on
past ``free`` (every queue up to its due count), so a gate that refuses a queue (paused, at its
concurrency limit) skips that queue's entries and the slots flow to the next queues in the
same proportions: the pass stays work-conserving without another round trip.

Weighted is smooth weighted round-robin over the queues that still have due work in the pass.
Each step every such queue's credit grows by its weight and the winner (highest credit, ties
to the earlier queue) pays the sum of those weights; a queue without due work banks its weight
per step, capped at the total weight T. When every queue has work this is exactly "grow by the
weight, the winner pays T", and a queue that runs out of work in a pass hands its remaining
steps to the others in proportion to their weights (reflow by weight, not by declaration
order). Credits move only in :meth:`Planner.charge`, for claims actually issued, charged to
the queue that actually served; the order itself is computed on a scratch copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import assert_never, overload

from relayer.dispatch.policies import (
    MaxLen,
    MinLen,
    Policy,
    Priority,
    RoundRobin,
    Strict,
    Weighted,
)


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of planning one pass."""

    order: Sequence[int]  # queue indices, most preferred first (an Order: computed as read)
    allocation: tuple[int, ...]  # per queue: entries among the first `free` of the order
    free: int


class Order(Sequence[int]):
    """A pass's preference order, computed only as far as it is read.

    With ``overflow`` an order runs on past the free slots (every queue up to its due count)
    for gates that refuse queues; a worker serving hundreds of stores plans over hundreds of
    queues, and computing every entry of such an order on every pass cost more than the pass
    (a Weighted step looks at every queue). A gate that grants the first entries reads no
    further; the entries read are the same as if all had been computed.
    """

    __slots__ = ("_entries", "_more")

    def __init__(self, entries: Iterable[int]) -> None:
        self._entries: list[int] = []
        self._more: Iterator[int] | None = iter(entries)

    def _fill(self, count: int | None) -> None:
        """Compute entries until there are ``count`` (None: all of them)."""
        more = self._more
        if more is None:
            return
        entries = self._entries
        if count is None:
            entries.extend(more)
            self._more = None
            return
        while len(entries) < count:
            entry = next(more, None)
            if entry is None:
                self._more = None
                return
            entries.append(entry)

    @overload
    def __getitem__(self, item: int) -> int: ...

    @overload
    def __getitem__(self, item: slice) -> tuple[int, ...]: ...

    def __getitem__(self, item: int | slice) -> int | tuple[int, ...]:
        if isinstance(item, slice):
            bounded = item.stop is not None and item.stop >= 0 and (item.start or 0) >= 0
            self._fill(item.stop if bounded else None)
            return tuple(self._entries[item])
        self._fill(item + 1 if item >= 0 else None)
        return self._entries[item]

    def __len__(self) -> int:
        self._fill(None)
        return len(self._entries)

    def __iter__(self) -> Iterator[int]:
        position = 0
        while True:
            self._fill(position + 1)
            if position >= len(self._entries):
                return
            yield self._entries[position]
            position += 1

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Order | tuple | list):
            return tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Order({tuple(self)!r})"


# A queue whose jobs are all running banks at most this many times what an idle one may: enough
# to be served at once when its work is due again, bounded when its keys cannot carry its share.
BUSY_CAPS = 2


def swrr_step(
    credits: list[int],
    weights: Sequence[int],
    eligible: Sequence[bool],
    total: int,
    winner: int | None = None,
    *,
    costs: Sequence[int] | None = None,
    busy: Sequence[bool] | None = None,
    cap: int | None = None,
) -> int:
    """One smooth weighted round-robin step over ``credits`` (mutated); returns the winner.

    ``winner`` forces the queue that serves (used when charging what was actually issued).
    ``costs``: what a job of each queue is expected to cost (default 1 each): the step is as
    long as the winner's cost, every credit grows by weight x cost and the winner pays the
    eligible weights x cost; the winner is the highest credit after one unit of growth, so
    with every cost 1 this is plain smooth weighted round-robin. ``busy``: queues without due
    work whose jobs are running; they grow and pay in like the eligible ones (their work is
    in flight, they are not idle), up to BUSY_CAPS times the idle cap, but cannot win.
    """
    chosen = _best(credits, weights, eligible) if winner is None else winner
    cost = 1 if costs is None else costs[chosen]
    # An idle queue banks at most T (in units of the costliest job: ``cap``, given by callers
    # that step many times), so it cannot come back with an unbounded burst.
    if cap is None:
        cap = total * (1 if costs is None else max(costs))
    paid = 0
    for index, weight in enumerate(weights):
        if eligible[index]:
            paid += weight
            credits[index] += weight * cost
        elif busy is not None and busy[index]:
            paid += weight
            credits[index] = min(BUSY_CAPS * cap, credits[index] + weight * cost)
        else:
            credits[index] = min(cap, credits[index] + weight * cost)
    credits[chosen] -= paid * cost
    return chosen


def _best(credits: Sequence[int], weights: Sequence[int], eligible: Sequence[bool]) -> int:
    """The eligible queue with the highest credit after one unit of growth (ties: the first)."""
    best, highest = -1, 0
    for index, weight in enumerate(weights):
        if eligible[index]:
            credit = credits[index] + weight
            if best < 0 or credit > highest:
                best, highest = index, credit
    return best


class Planner:
    """The planning state of one worker group: Weighted credits or the RoundRobin cursor."""

    __slots__ = (
        "_active",
        "_busy",
        "_costs",
        "_credits",
        "_cursor",
        "_policy",
        "_rank_order",
        "_total",
        "_weights",
    )

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._weights: tuple[int, ...] = ()
        self._total = 0
        if isinstance(policy, Weighted):
            self._weights = tuple(weight for _, weight in policy.weights)
            self._total = sum(self._weights)
        self._credits = [0] * len(policy.queues)
        # Weighted: what the next claim of each queue is charged (its last job's cost, 1
        # until one is settled), and which queues had due work in the last plan.
        self._costs = [1] * len(policy.queues)
        self._active = [False] * len(policy.queues)
        self._busy = [False] * len(policy.queues)  # running jobs, no due work (last plan)
        self._cursor = 0
        self._rank_order = policy.order() if isinstance(policy, Priority) else ()

    @property
    def policy(self) -> Policy:
        return self._policy

    def carried_to(self, policy: Policy) -> Planner:
        """A planner for ``policy`` (a worker group reconfigured between passes) that keeps
        the Weighted credit of each queue both policies serve, capped at the new total weight
        either way (a queue's credit never exceeds the total in a steady state, and a large
        debt or credit carried over would skew the next passes); new queues start at 0. A
        RoundRobin cursor stays on the same queue when it is still served."""
        planner = Planner(policy)
        queues = self._policy.queues
        if isinstance(policy, Weighted) and isinstance(self._policy, Weighted):
            credit = dict(zip(queues, self._credits, strict=True))
            total = planner._total
            top = total * max(self._costs, default=1)
            planner._credits = [max(-top, min(top, credit.get(name, 0))) for name in policy.queues]
            cost = dict(zip(queues, self._costs, strict=True))
            planner._costs = [cost.get(name, 1) for name in policy.queues]
        elif isinstance(policy, RoundRobin) and queues and policy.queues:
            following = queues[self._cursor % len(queues)]
            if following in policy.queues:
                planner._cursor = policy.queues.index(following)
        return planner

    @property
    def credits(self) -> tuple[int, ...]:
        return tuple(self._credits)

    def cost(self, index: int) -> int:
        """What a claim of queue ``index`` is charged now (Weighted; 1 for other policies)."""
        return self._costs[index]

    def settle(self, index: int, cost: int, charged: int) -> None:
        """A job of queue ``index``, charged ``charged`` when it was claimed, cost ``cost``
        (counted as at least 1): the difference is charged now, as a step of that length (negative
        refunds) over the queues that had due work in the last plan, and the queue's next
        claims are charged ``cost``. So the queues' shares of cost follow their weights while
        they have work, whatever a job costs."""
        if not isinstance(self._policy, Weighted):
            return
        if cost > 0:  # an empty job (a scan that found nothing) says nothing of the next
            self._costs[index] = cost
        delta = max(cost, 1) - charged
        if not delta:
            return
        weights, credits = self._weights, self._credits
        growing = [q for q, active in enumerate(self._active) if active or q == index]
        for q in growing:
            credits[q] += weights[q] * delta
        credits[index] -= sum(weights[q] for q in growing) * delta

    @property
    def exact_counts(self) -> bool:
        """True when the policy compares backlog lengths, so due counts must not be capped."""
        return isinstance(self._policy, MaxLen | MinLen)

    def plan(
        self,
        free: int,
        due: Sequence[int],
        *,
        overflow: bool = False,
        running: Sequence[int] | None = None,
    ) -> Plan:
        """Order the due work of one pass into ``free`` slots (and beyond, with overflow).
        ``running``: each queue's jobs running now (Weighted: a queue whose work is in flight
        is not idle; see swrr_step's ``busy``)."""
        caps = [max(0, min(count, free)) for count in due]
        wanted = sum(caps)
        length = wanted if overflow else min(free, wanted)
        if free <= 0 or length == 0:
            return Plan((), (0,) * len(due), max(free, 0))
        policy = self._policy
        order: Iterable[int]
        match policy:
            case Weighted():
                busy = [False] * len(caps) if running is None else [n > 0 for n in running]
                self._busy = [b and not cap for b, cap in zip(busy, caps, strict=True)]
                self._active = [cap > 0 or b for cap, b in zip(caps, busy, strict=True)]
                order = self._weighted(caps, length)
            case Strict():
                order = _in_order(range(len(caps)), caps, length)
            case Priority():
                order = _in_order(self._rank_order, caps, length)
            case RoundRobin():
                order = self._round_robin(caps, length)
            case MaxLen() | MinLen():
                order = _by_length(due, caps, length, longest=isinstance(policy, MaxLen))
            case _:
                assert_never(policy)
        lazy = Order(order)
        allocation = [0] * len(caps)
        for index in lazy[:free]:
            allocation[index] += 1
        return Plan(lazy, tuple(allocation), free)

    def charge(self, issued: Sequence[int], demand: Sequence[int]) -> None:
        """Account for the claims actually issued, in order, by the queues that served them.

        ``demand[q]`` is how many claims queue q could have taken in the pass: its due count
        (capped at the free slots), or fewer when the gate refused it (0 when paused, the slots
        it got when at its limit). A queue is charged only for what it served; a queue that had
        work but was not reached keeps its credit, so a cut-short pass never skews the shares.
        """
        if not issued:
            return
        if isinstance(self._policy, RoundRobin):
            self._cursor = (issued[-1] + 1) % len(self._credits)
            return
        if not isinstance(self._policy, Weighted):
            return
        count = len(self._credits)
        totals = [0] * count
        for index in issued:
            totals[index] += 1
        limits = [max(demand[q], totals[q]) for q in range(count)]
        costs, busy = self._costs, self._busy
        if all(totals[q] < limits[q] or limits[q] == 0 for q in range(count)):
            # No queue runs out of work during the pass, so every step sees the same eligible
            # set and the steps add up in closed form (an idle queue's cap is monotonic too).
            paid = sum(self._weights[q] for q in range(count) if limits[q] > 0 or busy[q])
            length = sum(totals[q] * costs[q] for q in range(count))
            cap = self._total * max(costs)
            for q in range(count):
                grown = self._credits[q] + length * self._weights[q]
                if limits[q] > 0:
                    self._credits[q] = grown - paid * totals[q] * costs[q]
                else:
                    self._credits[q] = min(BUSY_CAPS * cap if busy[q] else cap, grown)
            return
        served = [0] * count
        # A queue served in this pass has a job running now: busy, not idle, once it has had
        # all it could take.
        running = list(busy)
        cap = self._total * max(costs)
        for index in issued:
            eligible = [served[q] < limits[q] for q in range(len(limits))]
            swrr_step(
                self._credits,
                self._weights,
                eligible,
                self._total,
                index,
                costs=costs,
                busy=running,
                cap=cap,
            )
            served[index] += 1
            running[index] = True

    def _weighted(self, caps: list[int], length: int) -> Iterator[int]:
        # The state is copied now: the steps run as the order is read, maybe after a charge.
        credits = list(self._credits)
        eligible = [cap > 0 for cap in caps]
        return _weighted_steps(
            credits,
            self._weights,
            self._total,
            caps=caps,
            eligible=eligible,
            length=length,
            costs=list(self._costs),
            busy=list(self._busy),
        )

    def _round_robin(self, caps: list[int], length: int) -> list[int]:
        count = len(caps)
        cursor = self._cursor
        order: list[int] = []
        while len(order) < length:
            for step in range(count):
                index = (cursor + step) % count
                if caps[index] > 0:
                    break
            order.append(index)
            caps[index] -= 1
            cursor = (index + 1) % count
        return order


def _weighted_steps(
    credits: list[int],
    weights: Sequence[int],
    total: int,
    *,
    caps: list[int],
    eligible: list[bool],
    length: int,
    costs: list[int],
    busy: list[bool],
) -> Iterator[int]:
    cap = total * max(costs)
    for _ in range(length):
        winner = swrr_step(credits, weights, eligible, total, costs=costs, busy=busy, cap=cap)
        yield winner
        caps[winner] -= 1
        if caps[winner] == 0:
            eligible[winner] = False


def _in_order(sequence: Sequence[int], caps: Sequence[int], length: int) -> list[int]:
    order: list[int] = []
    for index in sequence:
        order.extend([index] * caps[index])
    return order[:length]


def _by_length(due: Sequence[int], caps: list[int], length: int, *, longest: bool) -> list[int]:
    # varmq reads the backlog lengths again for every job, so each step sees the counts left
    # after the previous steps of the same pass.
    left = list(due)
    order: list[int] = []
    while len(order) < length:
        best = -1
        for index, cap in enumerate(caps):
            if cap <= 0:
                continue
            if best < 0 or (left[index] > left[best] if longest else left[index] < left[best]):
                best = index
        order.append(best)
        caps[best] -= 1
        left[best] -= 1
    return order
