"""Wake-ups that arrive within ``wake_linger`` are served together: one batch transaction."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from relayer import Outbox, lane_for
from relayer.dispatch.cluster import ClaimRequest, ClaimResult
from relayer.relay.results import ScanResult
from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.dispatch.helpers import relayer_cli
from tests.integration.relay.helpers import pending


def keys_in_distinct_lanes(store: StoreSettings, count: int) -> list[str]:
    keys: dict[int, str] = {}
    number = 0
    while len(keys) < count:
        key = f"k{number}"
        keys.setdefault(lane_for(key, store.lanes), key)
        number += 1
    return list(keys.values())


async def sent_all(served: Any, store: StoreSettings, rows: int) -> None:
    """Wait (up to 30 s) until the worker has counted ``rows`` sent and the outbox is empty (the
    stats are recorded once a batch's result is in)."""
    async with asyncio.timeout(30):
        while served.relay.stats.sent != rows or pending(store) != 0:
            await asyncio.sleep(0.05)


class HeldWakeUps:
    """The wake-ups of a running worker's store, under the test's control: writers'
    notifications are held back and no probe starts (a fallback poll, a new share), so the
    lanes ``wake`` names are the only ones scanned, woken in one event-loop step (as a
    writer's notifications within one linger are) whatever the machine's load; and every batch
    that sends rows is recorded (``sent``: its lanes)."""

    def __init__(self, served: Any) -> None:
        self.wakeups = served.relay.wakeups
        self._woken = self.wakeups.woken
        self.held: list[str] = []
        self.wakeups.woken = self.held.append
        self.wakeups.wake_all = self._no_probe
        self.sent: list[list[int]] = []
        self._send_lanes = served.relay.batch.send_lanes
        served.relay.batch.send_lanes = self._recorded

    def _no_probe(self, *, fallback: bool = False) -> None:
        return None

    async def _recorded(self, conn: Any, lanes: Sequence[int]) -> list[ScanResult]:
        results: list[ScanResult] = await self._send_lanes(conn, lanes)
        if any(result.sent for result in results):
            self.sent.append(sorted(result.lane for result in results if result.sent))
        return results

    async def settled(self, lanes: int) -> None:
        """Once the member owns all ``lanes`` and no probe runs (one started before the
        wake-ups were held may find the rows the test writes)."""
        async with asyncio.timeout(30):
            while len(self.wakeups.membership.lanes) < lanes or not (
                self.wakeups._waking is None or self.wakeups._waking.done()
            ):
                await asyncio.sleep(0.02)

    def wake(self, lanes: Sequence[int]) -> None:
        for lane in lanes:
            self._woken(str(lane))


async def written(store: StoreSettings, keys: Sequence[str]) -> list[int]:
    """One committed row for each of ``keys``, each in a transaction of its own; their lanes."""
    outbox = Outbox(store)
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        for key in keys:
            await outbox.write_async(conn, destination="events", body=b"x", key=key)
            await conn.commit()
    return [lane_for(key, store.lanes) for key in keys]


async def linger_store(pg_dsn: str, linger: str) -> StoreSettings:
    """A store of 16 lanes relaying to a memory transport, ``wake_linger=linger``; schema
    applied."""
    store = make_store(
        pg_dsn,
        lanes=16,
        poll_interval="2s",
        lease_duration="10s",
        wake_linger=linger,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    return store


@dataclass
class Running:
    """A worker relaying a linger_store to a memory transport, its wake-ups held."""

    store: StoreSettings
    memory: MemoryTransport
    served: Any
    held: HeldWakeUps


@contextlib.asynccontextmanager
async def running(pg_dsn: str, linger: str, *, pool_size: int = 20) -> AsyncIterator[Running]:
    """A linger_store served by a running worker of ``pool_size`` slots, its wake-ups held
    (``HeldWakeUps``) once the worker owns every lane; stopped on exit."""
    store = await linger_store(pg_dsn, linger)
    memory = MemoryTransport("memory")
    worker = Worker(
        [store],
        transports={store.name: {"memory": memory}},
        settings=WorkerSettings(pool_size=pool_size),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.started.wait(), 30)
        served = worker.stores[store.name]
        held = HeldWakeUps(served)
        await held.settled(store.lanes)
        yield Running(store, memory, served, held)
    finally:
        stop.set()
        await task


async def test_wake_ups_within_the_linger_share_one_transaction(pg_dsn: str) -> None:
    """Three lanes woken within one linger go in one batch transaction: the first opens the
    window, the others join it and ride on its batch. One slot: a joiner cannot start a scan of
    its own, however late the opener's batch comes."""
    async with running(pg_dsn, "1s", pool_size=1) as worker:
        lanes = await written(worker.store, keys_in_distinct_lanes(worker.store, 3))
        worker.held.wake(lanes)
        await sent_all(worker.served, worker.store, 3)
    assert len(worker.memory.received("events")) == 3
    assert worker.held.sent == [sorted(lanes)]


async def test_without_linger_each_wake_up_is_served_on_its_own(pg_dsn: str) -> None:
    """wake_linger 0 opens no window: a lane woken after the last batch ended is sent in a
    transaction of its own."""
    async with running(pg_dsn, "0s") as worker:
        lanes = []
        for number, key in enumerate(keys_in_distinct_lanes(worker.store, 3), 1):
            lanes += await written(worker.store, [key])
            worker.held.wake(lanes[-1:])
            await sent_all(worker.served, worker.store, number)
    assert len(worker.memory.received("events")) == 3
    assert worker.held.sent == [[lane] for lane in lanes]


def recorded_claims(served: Any) -> list[tuple[float, int]]:
    """Every claim the store's gate answers from now on: when (the store's clock) and how many
    slots it granted (0: refused)."""
    assert served.gate is not None
    claims: list[tuple[float, int]] = []
    acquire = served.gate.acquire

    async def recorded(request: ClaimRequest) -> ClaimResult:
        result: ClaimResult = await acquire(request)
        claims.append((served.relay.schedule.now(), len(result.grants)))
        return result

    served.gate.acquire = recorded
    return claims


async def test_a_window_is_claimed_once_and_its_lanes_ride_on_that_slot(pg_dsn: str) -> None:
    """The lane that opens a window is due at once (tests/unit/test_wake_window.py): its
    dispatch claim is made while the window gathers lanes; the lanes woken later in the window
    go in its batch at the window's end, on the one slot it was granted, and nothing else is
    claimed for them (one slot: none of them can start a scan of its own meanwhile)."""
    async with running(pg_dsn, "1s", pool_size=1) as worker:
        lanes = await written(worker.store, keys_in_distinct_lanes(worker.store, 3))
        claims = recorded_claims(worker.served)
        worker.held.wake(lanes)
        await sent_all(worker.served, worker.store, 3)
    assert len(worker.memory.received("events")) == 3
    assert pending(worker.store) == 0
    assert worker.held.sent == [sorted(lanes)]
    assert [slots for _, slots in claims if slots] == [1], claims


async def test_a_paused_store_sends_no_window_and_every_lane_of_it_goes_once_resumed(
    pg_dsn: str,
) -> None:
    """The opener's claim is refused while the store is paused: neither it nor the lanes that
    joined its window are sent (also once they are due on their own), and all of them go once
    the store is resumed."""
    async with running(pg_dsn, "200ms") as worker:
        store, served = worker.store, worker.served
        await asyncio.to_thread(relayer_cli, store, "queue", "pause", store.name, "--by", "t")
        lanes = await written(store, keys_in_distinct_lanes(store, 3))
        claims = recorded_claims(served)
        worker.held.wake(lanes)
        window = served.relay.wakeups.window
        joiners_due = window.ends + window.linger
        async with asyncio.timeout(30):  # refused once the joiners were due on their own too
            while not any(at >= joiners_due and not slots for at, slots in claims):
                await asyncio.sleep(0.05)
        assert worker.memory.received("events") == []
        assert worker.held.sent == []
        assert not any(slots for _, slots in claims)
        await asyncio.to_thread(relayer_cli, store, "queue", "resume", store.name, "--by", "t")
        await sent_all(served, store, 3)
    assert len(worker.memory.received("events")) == 3
    assert pending(store) == 0
