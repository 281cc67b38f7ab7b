"""The fallback poll probes nothing while every owned lane has a scan waiting or running: each
of them is scanned anyway (under a backlog the probe of a whole share cost more than a batch)."""

from __future__ import annotations

import asyncio

from relayer.relay.runtime import StoreRelay
from relayer.relay.schedule import LaneSchedule
from relayer.settings import WorkerSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store

LANES = 4


def idle(relay: StoreRelay) -> bool:
    waking = relay.wakeups._waking
    return waking is None or waking.done()


async def test_a_poll_skips_its_probe_while_every_owned_lane_is_queued(pg_dsn: str) -> None:
    # Polled by its own timer: with in_transaction wake-ups an idle store's poll is its own
    # (in the other modes an idle store waits in its database's idle watch, which probes
    # nothing while no lane holds a row).
    store = make_store(pg_dsn, lanes=LANES, poll_interval="0.05s", notify="in_transaction")
    await apply_schema(store)
    worker = Worker(
        [store],
        transports={store.name: {"memory": MemoryTransport("memory")}},
        settings=WorkerSettings(pool_size=2),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        async with asyncio.timeout(30):
            while (
                not worker.stores.get(store.name)
                or len(worker.stores[store.name].relay.membership.lanes) < LANES
            ):
                await asyncio.sleep(0.02)
        relay = worker.stores[store.name].relay
        answers: list[bool] = []
        original = LaneSchedule.every_lane_queued

        def counted() -> bool:
            answer = original(relay.schedule)
            answers.append(answer)
            return answer

        relay.schedule.every_lane_queued = counted  # type: ignore[method-assign]
        for lane in range(LANES):  # a scan waits for every lane (far ahead: none runs)
            relay.schedule.queue.schedule(lane, relay.schedule.now() + 3600)
        async with asyncio.timeout(30):
            # A poll saw every lane queued, and a wake-up started before it is over.
            while True not in answers or not idle(relay):
                await asyncio.sleep(0.02)
        probes, seen = relay.prober.queries, len(answers)
        async with asyncio.timeout(30):
            while answers[seen:].count(True) < 3:
                await asyncio.sleep(0.02)
        assert relay.prober.queries == probes  # three polls, no probe

        relay.schedule.queue.discard(0)  # lane 0 is quiet now: a poll must look at it
        async with asyncio.timeout(30):
            while relay.prober.queries == probes:
                await asyncio.sleep(0.02)
        assert answers[-1] is False
    finally:
        stop.set()
        await task
