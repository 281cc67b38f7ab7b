"""Policy validation: when a group starts, with messages that say what is wrong."""

import pytest

from relayer.dispatch import (
    InvalidDispatchError,
    MaxLen,
    MemoryQueue,
    MinLen,
    Priority,
    RoundRobin,
    Strict,
    Weighted,
    WorkerGroup,
    validate,
)
from relayer.errors import DispatchError

WEIGHTED = "Weighted dispatch needs at least one queue, all weights >= 1."


async def nothing(job: object) -> None:
    return None


@pytest.mark.parametrize(
    "policy",
    [Weighted([]), Weighted({}), Weighted([("a", 0)]), Weighted([("a", 3), ("b", -1)])],
)
def test_weighted_message_is_exact(policy: Weighted) -> None:
    with pytest.raises(ValueError) as caught:
        validate(policy)
    assert str(caught.value) == WEIGHTED
    assert isinstance(caught.value, DispatchError)


def test_weighted_rejects_non_integer_weights() -> None:
    with pytest.raises(ValueError) as caught:
        validate(Weighted([("a", 1.5)]))  # type: ignore[list-item]
    assert str(caught.value) == WEIGHTED
    with pytest.raises(ValueError, match="Weighted dispatch needs"):
        validate(Weighted([("a", True)]))


def test_building_a_policy_never_fails_validation_happens_at_group_start() -> None:
    policy = Weighted([])  # constructing is fine
    group = WorkerGroup(policy, [], nothing)  # so is building the group
    with pytest.raises(InvalidDispatchError) as caught:
        group.validate()
    assert str(caught.value) == WEIGHTED


@pytest.mark.parametrize(
    "policy",
    [
        Weighted([("a", "3")]),  # type: ignore[list-item]
        Weighted({"a": None}),  # type: ignore[dict-item]
        Weighted(["a"]),  # type: ignore[list-item]
        Priority(("a", "first"), ("b", 2)),  # type: ignore[arg-type]
        Priority(["a", 1]),  # type: ignore[arg-type]
    ],
)
async def test_a_policy_of_the_wrong_types_fails_at_start_with_invalid_dispatch_error(
    policy: Weighted | Priority,
) -> None:
    group = WorkerGroup(policy, [MemoryQueue("a"), MemoryQueue("b")], nothing)
    with pytest.raises(InvalidDispatchError):
        group.validate()
    with pytest.raises(InvalidDispatchError):
        await group.run()


async def test_run_raises_the_validation_error() -> None:
    group = WorkerGroup(Weighted([("a", 0)]), [MemoryQueue("a")], nothing)
    with pytest.raises(ValueError) as caught:
        await group.run()
    assert str(caught.value) == WEIGHTED


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (Strict(), "Strict dispatch needs at least one queue."),
        (RoundRobin(), "RoundRobin dispatch needs at least one queue."),
        (MaxLen(), "MaxLen dispatch needs at least one queue."),
        (MinLen(), "MinLen dispatch needs at least one queue."),
        (Priority(), "Priority dispatch needs at least one queue."),
        (
            Strict("a", "b", "a"),
            "Strict dispatch lists queue 'a' more than once; list each queue once.",
        ),
        (
            Weighted([("a", 1), ("a", 2)]),
            "Weighted dispatch lists queue 'a' more than once; list each queue once.",
        ),
        (
            Priority(("x", 1), "x"),
            "Priority dispatch lists queue 'x' more than once; list each queue once.",
        ),
        (Strict(""), "a queue name is a non-empty string, got ''."),
        (
            Strict("*"),
            "'*' cannot name a queue: it stands for every queue in pause and resume.",
        ),
        (
            Priority(("x", "high")),  # type: ignore[arg-type]
            "Priority dispatch ranks are integers or None; queue 'x' has rank 'high'.",
        ),
    ],
)
def test_policy_messages(policy: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        validate(policy)
    assert str(caught.value) == message


@pytest.mark.parametrize("pool_size", [0, -1, 1.5, True, "20"])
def test_pool_size_message(pool_size: object) -> None:
    with pytest.raises(ValueError) as caught:
        validate(Strict("a"), pool_size)
    assert str(caught.value) == (
        f"A worker group's pool_size must be an integer >= 1, got {pool_size!r}."
    )


def test_not_a_policy() -> None:
    with pytest.raises(ValueError, match="policy must be one of Strict, Weighted"):
        validate(["a", "b"])


def test_sources_must_match_the_policy() -> None:
    group = WorkerGroup(Strict("a", "b"), [MemoryQueue("a"), MemoryQueue("c")], nothing)
    with pytest.raises(ValueError) as caught:
        group.validate()
    assert "serves queues ['a', 'b'] but the sources are ['a', 'c']" in str(caught.value)
    twice = WorkerGroup(Strict("a"), [MemoryQueue("a"), MemoryQueue("a")], nothing)
    with pytest.raises(ValueError, match="two sources named 'a'"):
        twice.validate()


def test_queues_and_defaults() -> None:
    assert Weighted([("a", 6), ("b", 3)]).queues == ("a", "b")
    assert Weighted({"a": 6, "b": 3}) == Weighted([("a", 6), ("b", 3)])
    assert Priority(("alerts", 1), ("reports", 2), "emails").queues == (
        "alerts",
        "reports",
        "emails",
    )
    assert MemoryQueue().name == "default"
    assert validate(Strict("x", "y")) == ("x", "y")
    group = WorkerGroup(Strict("default"), [MemoryQueue()], nothing)
    assert group.pool_size == 20


def test_policies_are_frozen_values() -> None:
    policy = Strict("a")
    with pytest.raises(AttributeError):
        policy.queues = ("b",)  # type: ignore[misc]
    assert hash(Weighted([("a", 1)])) == hash(Weighted([("a", 1)]))
    assert Strict("a") != RoundRobin("a") and MaxLen("a") != MinLen("a")
