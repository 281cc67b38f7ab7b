"""Wake-up probes leave out the lanes whose scan is settled already: a full wake-up (a
notification for every lane, a reconnect, a new share) the lanes whose head is known to be due,
the fallback poll every lane whose scan waits or runs."""

from __future__ import annotations

from collections.abc import Collection

from relayer.store import LaneHead
from relayer.transports.memory import MemoryTransport
from relayer.worker import StoreRuntime, Worker
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import keys_in_lane, write


async def test_wake_up_probes_leave_out_lanes_whose_scan_is_settled(pg_dsn: str) -> None:
    store = make_store(
        pg_dsn, lanes=8, transports={"memory": {"type": "memory"}}, default_transport="memory"
    )
    await apply_schema(store)
    for lane in (1, 2, 5):
        write(store, keys_in_lane(store, lane, 1))
    worker = Worker([store], transports={store.name: {"memory": MemoryTransport("memory")}})
    runtime = worker.runtimes[store.name]
    probes: list[tuple[set[int], list[int]]] = []
    heads = runtime.prober.heads

    async def recorded(rank: int, members: int, *, skip: Collection[int] = ()) -> list[LaneHead]:
        found = await heads(rank, members, skip=skip)
        probes.append((set(skip), [head.lane for head in found]))
        return found

    runtime.prober.heads = recorded  # type: ignore[method-assign]
    # Opened, but no worker group runs: the scans the probes schedule stay in the queue.
    await runtime.open()
    try:
        await woken(runtime)  # its share was new: a full probe
        assert probes == [(set(), [1, 2, 5])]
        assert runtime.queue.keys() == {1, 2, 5}

        write(store, keys_in_lane(store, 6, 1))
        runtime.wake_all()  # their heads are known due: only the others are looked up
        await woken(runtime)
        assert probes[-1] == ({1, 2, 5}, [6])

        (job,) = runtime.queue.claim(runtime.now(), 1)  # lane 1's scan is running
        runtime.queue.schedule(3, runtime.now() + 60)  # lane 3's scan waits (no head known)
        write(store, keys_in_lane(store, 3, 1) + keys_in_lane(store, 7, 1))
        runtime.wake_all(fallback=True)  # lanes whose scan waits or runs are left out
        await woken(runtime)
        assert probes[-1] == ({1, 2, 3, 5, 6}, [7])
        runtime.queue.finish(job)
    finally:
        await runtime.close()


async def woken(runtime: StoreRuntime) -> None:
    waking = runtime._waking
    assert waking is not None
    await waking
