"""Wake-up probes leave out the lanes whose scan is settled already: a full wake-up (a
notification for every lane, a reconnect, a new share) the lanes whose head is known to be due,
the fallback poll every lane whose scan waits or runs."""

from __future__ import annotations

from collections.abc import Collection

from relayer.relay.runtime import StoreRelay
from relayer.relay.wakeups import FIRST_PROBE_LANES, probe_parts
from relayer.store import LaneHead
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import keys_in_lane, write


async def test_wake_up_probes_leave_out_lanes_whose_scan_is_settled(pg_dsn: str) -> None:
    store = make_store(
        pg_dsn, lanes=8, transports={"memory": {"type": "memory"}}, default_transport="memory",
        notify="in_transaction",  # no hot polls (after_commit's) among the probes counted
    )  # fmt: skip
    await apply_schema(store)
    for lane in (1, 2, 5):
        write(store, keys_in_lane(store, lane, 1))
    worker = Worker([store], transports={store.name: {"memory": MemoryTransport("memory")}})
    served = worker.stores[store.name]
    relay = served.relay
    probes: list[tuple[set[int], list[int]]] = []
    heads = relay.prober.heads

    async def recorded(
        rank: int, members: int, *, skip: Collection[int] = (), lanes: range | None = None
    ) -> list[LaneHead]:
        assert lanes == range(8)  # a share this small is probed in one query
        found = await heads(rank, members, skip=skip, lanes=lanes)
        probes.append((set(skip), [head.lane for head in found]))
        return found

    relay.prober.heads = recorded  # type: ignore[method-assign]
    # Opened, but no worker group runs: the scans the probes schedule stay in the queue.
    await served.open()
    try:
        await woken(relay)  # its share was new: a full probe
        assert probes == [(set(), [1, 2, 5])]
        assert relay.schedule.queue.keys() == {1, 2, 5}

        write(store, keys_in_lane(store, 6, 1))
        relay.wakeups.wake_all()  # their heads are known due: only the others are looked up
        await woken(relay)
        assert probes[-1] == ({1, 2, 5}, [6])

        (job,) = relay.schedule.queue.claim(relay.schedule.now(), 1)  # lane 1's scan is running
        relay.schedule.queue.schedule(
            3, relay.schedule.now() + 60
        )  # lane 3's scan waits (no head known)
        write(store, keys_in_lane(store, 3, 1) + keys_in_lane(store, 7, 1))
        relay.wakeups.wake_all(fallback=True)  # lanes whose scan waits or runs are left out
        await woken(relay)
        assert probes[-1] == ({1, 2, 3, 5, 6}, [7])
        relay.schedule.queue.finish(job)
    finally:
        await served.close()


async def woken(relay: StoreRelay) -> None:
    waking = relay.wakeups._waking
    assert waking is not None
    await waking


async def test_a_wake_up_over_many_lanes_probes_the_first_lanes_first(pg_dsn: str) -> None:
    """Over more than 2 x FIRST_PROBE_LANES lanes a wake-up probes the first FIRST_PROBE_LANES
    lanes, schedules their scans, then probes the rest: every lane with rows is found once."""
    lanes = 2 * FIRST_PROBE_LANES + 1000
    store = make_store(
        pg_dsn, lanes=lanes, transports={"memory": {"type": "memory"}}, default_transport="memory",
        notify="in_transaction",  # no hot polls (after_commit's) among the probes counted
    )  # fmt: skip
    await apply_schema(store)
    busy = (0, 5, FIRST_PROBE_LANES - 1, FIRST_PROBE_LANES, FIRST_PROBE_LANES + 7, lanes - 1)
    for lane in busy:
        write(store, keys_in_lane(store, lane, 1))
    worker = Worker([store], transports={store.name: {"memory": MemoryTransport("memory")}})
    served = worker.stores[store.name]
    relay = served.relay
    probes: list[tuple[range | None, list[int], set[int]]] = []
    heads = relay.prober.heads

    async def recorded(
        rank: int, members: int, *, skip: Collection[int] = (), lanes: range | None = None
    ) -> list[LaneHead]:
        found = await heads(rank, members, skip=skip, lanes=lanes)
        # What was scheduled before this part's heads came back: the earlier parts' lanes.
        probes.append((lanes, [head.lane for head in found], set(relay.schedule.queue.keys())))
        return found

    relay.prober.heads = recorded  # type: ignore[method-assign]
    await served.open()
    try:
        await woken(relay)
        first, rest = range(FIRST_PROBE_LANES), range(FIRST_PROBE_LANES, lanes)
        in_first = [0, 5, FIRST_PROBE_LANES - 1]
        assert probes == [
            (first, in_first, set()),
            (rest, [FIRST_PROBE_LANES, FIRST_PROBE_LANES + 7, lanes - 1], set(in_first)),
        ]
        assert relay.schedule.queue.keys() == set(busy)
    finally:
        await served.close()


def test_probe_parts_split_only_large_shares() -> None:
    assert probe_parts(1) == [range(1)]
    assert probe_parts(2 * FIRST_PROBE_LANES) == [range(2 * FIRST_PROBE_LANES)]
    assert probe_parts(65_536) == [range(FIRST_PROBE_LANES), range(FIRST_PROBE_LANES, 65_536)]
