"""Stores joining and leaving a worker, without a database: shared transports start with
their first store and close with their last; add_store and remove_store refuse misuse."""

from __future__ import annotations

import pytest

from relayer.errors import ConfigurationError, UsageError
from relayer.settings import StoreSettings, store_settings
from relayer.transports.lifecycle import SharedTransports
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker


async def test_a_shared_transport_starts_with_its_first_user_and_closes_with_its_last() -> None:
    shared = SharedTransports()
    kafka, other = MemoryTransport("kafka"), MemoryTransport("other")
    await shared.acquire([kafka], close_within=1)
    await shared.acquire([kafka, other, other], close_within=1)  # twice in one store: once
    assert kafka.started and other.started
    assert (shared.users(kafka), shared.users(other)) == (2, 1)
    await shared.release([kafka, other], close_within=1)
    assert not kafka.closed and other.closed
    await shared.release([kafka], close_within=1)
    assert kafka.closed and shared.users(kafka) == 0
    await shared.acquire([kafka], close_within=1)  # a new first user starts it again
    assert kafka.started and not kafka.closed


async def test_a_transport_that_fails_to_start_releases_the_ones_started_with_it() -> None:
    shared = SharedTransports()
    good, bad = MemoryTransport("good"), MemoryTransport("bad")
    bad.fail_start(RuntimeError("no broker"))
    with pytest.raises(RuntimeError, match="no broker"):
        await shared.acquire([good, bad], close_within=1)
    assert good.closed and shared.users(good) == 0 and shared.users(bad) == 0


def store(name: str) -> StoreSettings:
    return store_settings(name=name, dsn="postgresql://u@127.0.0.1:1/db", table_prefix=f"{name}_")


async def test_stores_added_before_run_are_registered_and_can_be_removed() -> None:
    worker = Worker([], instance_id="w")
    assert worker.readiness() == (False, "starting")
    await worker.add_store(store("a"), {}, weight=3)
    await worker.add_store(store("b"), {})
    assert list(worker.stores) == ["a", "b"]
    assert [queue for queue, _ in worker.group.policy.weights] == [  # type: ignore[union-attr]
        "a",
        "b",
        "a:maintenance",
        "b:maintenance",
    ]
    assert (worker.weight("a"), worker.weight("b")) == (3, 1)
    with pytest.raises(ConfigurationError, match="case-sensitive and unique"):
        await worker.add_store(store("a"), {})
    with pytest.raises(ConfigurationError, match="weights are >= 1"):
        await worker.add_store(store("c"), {}, weight=0)
    await worker.remove_store("a")
    assert list(worker.stores) == ["b"]
    await worker.remove_store("b")
    assert worker.group.policy is None
    with pytest.raises(UsageError, match="is not served by worker w"):
        await worker.remove_store("b")
