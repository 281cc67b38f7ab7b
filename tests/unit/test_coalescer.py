"""relayer.relay.Coalescer: the lanes asked for in one event-loop turn are served together."""

from __future__ import annotations

import asyncio

import pytest

from relayer.relay.coalescing import Coalescer


class Server:
    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[list[int]] = []
        self.fail = fail

    async def __call__(self, lanes: list[int]) -> dict[int, str]:
        self.calls.append(lanes)
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        return {lane: f"lane {lane}" for lane in lanes}


async def test_lanes_asked_for_in_one_turn_are_served_together_in_chunks() -> None:
    server = Server()
    coalescer: Coalescer[str] = Coalescer(server, chunk=16)
    results = await asyncio.gather(*(coalescer.get(lane) for lane in range(19, -1, -1)))
    assert results == [f"lane {lane}" for lane in range(19, -1, -1)]
    assert server.calls == [list(range(16)), [16, 17, 18, 19]]


async def test_a_lane_alone_is_served_at_once_and_later_turns_make_new_batches() -> None:
    server = Server()
    coalescer: Coalescer[str] = Coalescer(server)
    assert await coalescer.get(7) == "lane 7"
    assert await coalescer.get(3) == "lane 3"
    assert server.calls == [[7], [3]]


async def test_a_lane_asked_for_twice_in_one_turn_is_served_once() -> None:
    server = Server()
    coalescer: Coalescer[str] = Coalescer(server)
    assert await asyncio.gather(coalescer.get(5), coalescer.get(5)) == ["lane 5", "lane 5"]
    assert server.calls == [[5]]


async def test_a_failure_reaches_every_waiter_of_its_batch() -> None:
    coalescer: Coalescer[str] = Coalescer(Server(fail=OSError("connection refused")))
    results = await asyncio.gather(coalescer.get(1), coalescer.get(2), return_exceptions=True)
    assert [str(result) for result in results] == ["connection refused"] * 2


async def test_a_lane_the_server_did_not_answer_is_an_error_not_a_hang() -> None:
    async def partial(lanes: list[int]) -> dict[int, str]:
        return {lanes[0]: "first"}

    coalescer: Coalescer[str] = Coalescer(partial)
    first, second = await asyncio.gather(coalescer.get(1), coalescer.get(2), return_exceptions=True)
    assert first == "first"
    assert isinstance(second, LookupError)


async def test_close_cancels_what_is_still_being_served() -> None:
    started = asyncio.Event()

    async def slow(lanes: list[int]) -> dict[int, str]:
        started.set()
        await asyncio.sleep(60)
        return {}

    coalescer: Coalescer[str] = Coalescer(slow)
    waiter = asyncio.ensure_future(coalescer.get(1))
    await started.wait()
    await asyncio.wait_for(coalescer.close(), 1)
    with pytest.raises(RuntimeError, match="cancelled"):
        await waiter


async def test_a_cancelled_caller_leaves_its_batch_and_the_other_waiters_alone() -> None:
    release = asyncio.Event()
    served: list[list[int]] = []

    async def slow(lanes: list[int]) -> dict[int, str]:
        served.append(lanes)
        await release.wait()
        return {lane: f"lane {lane}" for lane in lanes}

    coalescer: Coalescer[str] = Coalescer(slow)
    first = asyncio.ensure_future(coalescer.get(1))
    second = asyncio.ensure_future(coalescer.get(2))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == "lane 2"
    assert first.cancelled()
    assert served == [[1, 2]]
