"""The destination capability cache of a store's routing and the rank split of lanes (no I/O)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relayer.relay.membership import share
from relayer.transports.memory import MemoryTransport
from relayer.transports.routing import CAPACITY, DestinationCache, PreparationError


@pytest.fixture
async def memory() -> MemoryTransport:
    transport = MemoryTransport("memory")
    await transport.start()
    return transport


async def test_positive_answers_are_cached_fifo_up_to_256(memory: MemoryTransport) -> None:
    cache = DestinationCache()
    for number in range(CAPACITY):
        await cache.require_ordered(memory, f"topic-{number}")
    assert len(cache) == CAPACITY == 256
    await cache.require_ordered(memory, "topic-0")  # a hit does not refresh the entry
    assert memory.lookups.count("topic-0") == 1
    await cache.require_ordered(memory, "topic-new")
    assert len(cache) == CAPACITY
    assert ("memory", "topic-0") not in cache  # the oldest insertion went first
    assert ("memory", "topic-1") in cache
    await cache.require_ordered(memory, "topic-0")
    assert memory.lookups.count("topic-0") == 2


async def test_unordered_destinations_are_refused_and_never_cached(
    memory: MemoryTransport,
) -> None:
    cache = DestinationCache()
    memory.declare_unordered("fanout")
    for _ in range(2):
        with pytest.raises(PreparationError, match="does not keep per-key order"):
            await cache.require_ordered(memory, "fanout")
    assert memory.lookups.count("fanout") == 2
    memory.declare_ordered("fanout")
    await cache.require_ordered(memory, "fanout")  # recovers without a restart
    assert ("memory", "fanout") in cache


async def test_failed_lookups_are_never_cached(memory: MemoryTransport) -> None:
    cache = DestinationCache()
    memory.declare_unknown("ghost")
    with pytest.raises(PreparationError, match="cannot check destination 'ghost'"):
        await cache.require_ordered(memory, "ghost")
    assert ("memory", "ghost") not in cache
    memory.declare_ordered("ghost")
    await cache.require_ordered(memory, "ghost")
    assert ("memory", "ghost") in cache


@given(st.integers(min_value=1, max_value=65_536), st.integers(min_value=1, max_value=50))
def test_shares_cover_every_lane_once_and_differ_by_at_most_one(lanes: int, members: int) -> None:
    shares = [share(rank, members, lanes) for rank in range(members)]
    assert sum(len(part) for part in shares) == lanes
    assert frozenset().union(*shares) == frozenset(range(lanes))
    sizes = [len(part) for part in shares]
    assert max(sizes) - min(sizes) <= 1


def test_a_member_outside_the_live_list_has_no_share() -> None:
    assert share(-1, 3, 16) == frozenset()
    assert share(0, 0, 16) == frozenset()
