"""Dispatch policies: the closed set of rules a worker group uses to pick the next queue.

Policies are plain values. Building one never fails; :func:`validate` checks it when a worker
group starts, so a bad configuration surfaces as the group comes up (as BackWave does) and the
error names what is wrong. Every policy is deterministic: no randomness takes part anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeAlias, assert_never

from relayer.errors import DispatchError

DEFAULT_QUEUE = "default"
DEFAULT_POOL_SIZE = 20
MAX_QUEUE_NAME = 200
ALL_QUEUES = "*"  # the name under which "pause every queue" is stored; never a queue's name

WEIGHTED_MESSAGE = "Weighted dispatch needs at least one queue, all weights >= 1."


class InvalidDispatchError(DispatchError, ValueError):
    """A policy, a queue name or a pool size is invalid (raised when a worker group starts)."""


@dataclass(frozen=True, slots=True, init=False)
class _QueueList:
    """A policy that is just its queues, in order: ``Strict("a", "b")``."""

    queues: tuple[str, ...]

    def __init__(self, *queues: str) -> None:
        object.__setattr__(self, "queues", tuple(queues))


@dataclass(frozen=True, slots=True, init=False)
class Strict(_QueueList):
    """Serve ``queues`` in order: a later queue only when every earlier one has no due work."""


@dataclass(frozen=True, slots=True, init=False)
class Weighted:
    """Smooth weighted round-robin: ``Weighted([("a", 6), ("b", 3), ("c", 1)])``."""

    weights: tuple[tuple[str, int], ...]

    def __init__(self, weights: Iterable[tuple[str, int]] | Mapping[str, int]) -> None:
        items = weights.items() if isinstance(weights, Mapping) else weights
        object.__setattr__(self, "weights", tuple(items))

    @property
    def queues(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.weights)

    @property
    def total(self) -> int:
        return sum(weight for _, weight in self.weights)


@dataclass(frozen=True, slots=True, init=False)
class Priority:
    """varmq's Priority: the lowest rank first, unranked queues last, equal ranks in list order.

    ``Priority(("alerts", 1), ("reports", 2), "emails")``: a bare name has no rank.
    """

    ranks: tuple[tuple[str, int | None], ...]

    def __init__(self, *queues: str | tuple[str, int | None]) -> None:
        ranked = tuple((item, None) if isinstance(item, str) else item for item in queues)
        object.__setattr__(self, "ranks", ranked)

    @property
    def queues(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.ranks)

    def order(self) -> tuple[int, ...]:
        """Queue indices from first to last served: by rank, unranked last, ties in list order."""
        return tuple(
            sorted(
                range(len(self.ranks)),
                key=lambda index: (self.ranks[index][1] is None, self.ranks[index][1] or 0, index),
            )
        )


@dataclass(frozen=True, slots=True, init=False)
class RoundRobin(_QueueList):
    """One job from each queue in turn; a queue with no due work loses its turn."""


@dataclass(frozen=True, slots=True, init=False)
class MaxLen(_QueueList):
    """The queue with the most due jobs; ties to the earlier queue."""


@dataclass(frozen=True, slots=True, init=False)
class MinLen(_QueueList):
    """The queue with the fewest due jobs, ignoring queues with none; ties to the earlier queue."""


Policy: TypeAlias = Strict | Weighted | Priority | RoundRobin | MaxLen | MinLen
POLICIES: tuple[type, ...] = (Strict, Weighted, Priority, RoundRobin, MaxLen, MinLen)


def check_queue_name(name: object) -> str:
    """Return ``name`` if it can name a queue: a non-empty string of at most 200 characters."""
    if not isinstance(name, str) or not name:
        raise InvalidDispatchError(f"a queue name is a non-empty string, got {name!r}.")
    if len(name) > MAX_QUEUE_NAME:
        raise InvalidDispatchError(
            f"queue name {name[:40]!r}... is {len(name)} characters; the limit is {MAX_QUEUE_NAME}."
        )
    if name == ALL_QUEUES:
        raise InvalidDispatchError(
            f"{ALL_QUEUES!r} cannot name a queue: it stands for every queue in pause and resume."
        )
    return name


def check_pool_size(pool_size: object) -> int:
    if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
        raise InvalidDispatchError(
            f"A worker group's pool_size must be an integer >= 1, got {pool_size!r}."
        )
    return pool_size


def validate(policy: object, pool_size: object = DEFAULT_POOL_SIZE) -> tuple[str, ...]:
    """Check ``policy`` and ``pool_size``; return the policy's queues in declaration order."""
    if not isinstance(policy, Strict | Weighted | Priority | RoundRobin | MaxLen | MinLen):
        kinds = ", ".join(kind.__name__ for kind in POLICIES)
        raise InvalidDispatchError(
            f"A worker group's policy must be one of {kinds}; got {type(policy).__name__}."
        )
    check_pool_size(pool_size)
    kind = type(policy).__name__
    match policy:
        case Weighted():
            for item in policy.weights:
                if not isinstance(item, tuple) or len(item) != 2:
                    raise InvalidDispatchError(
                        f"Weighted dispatch takes (queue, weight) pairs; got {item!r}."
                    )
            if not policy.weights or any(
                isinstance(weight, bool) or not isinstance(weight, int) or weight < 1
                for _, weight in policy.weights
            ):
                raise InvalidDispatchError(WEIGHTED_MESSAGE)
        case Priority():
            for ranked in policy.ranks:
                if not isinstance(ranked, tuple) or len(ranked) != 2:
                    raise InvalidDispatchError(
                        "Priority dispatch takes queue names or (queue, rank) pairs; "
                        f"got {ranked!r}."
                    )
            for name, rank in policy.ranks:
                if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
                    raise InvalidDispatchError(
                        f"Priority dispatch ranks are integers or None; queue {name!r} has "
                        f"rank {rank!r}."
                    )
        case Strict() | RoundRobin() | MaxLen() | MinLen():
            pass
        case _:
            assert_never(policy)
    queues = policy.queues
    if not queues:
        raise InvalidDispatchError(f"{kind} dispatch needs at least one queue.")
    seen: set[str] = set()
    for name in queues:
        check_queue_name(name)
        if name in seen:
            raise InvalidDispatchError(
                f"{kind} dispatch lists queue {name!r} more than once; list each queue once."
            )
        seen.add(name)
    return queues


def configured_shares(policy: Policy) -> tuple[float | None, ...]:
    """The share of service each queue is configured to get: weight / total for Weighted."""
    if isinstance(policy, Weighted):
        total = policy.total
        return tuple(weight / total for _, weight in policy.weights)
    return tuple(None for _ in policy.queues)
