"""The workers' poll is the backstop of every wake-up: with the wake-ups after the commit all
lost on purpose, every row is still delivered, found by the first or second fallback poll
after its commit (within a poll interval, whatever the machine's speed: counted in polls, not
in seconds), and an idle store's poll does not stretch beyond poll_interval in that mode."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import psycopg
import pytest

from relayer import Outbox
from relayer.relay import wakeups as wakeups_module
from relayer.settings import StoreSettings
from relayer.store import LaneHead
from relayer.store.notifier import NotifyConnection, Wake
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from relayer.writer import waker as waker_module
from relayer.writer.waker import Waker
from tests.conftest import apply_schema, make_store

ROWS = 20


class Dropped(NotifyConnection):
    """A wake-up connection that loses every wake-up (as a writer's process that died right
    after its commit would)."""

    def __init__(self, store: StoreSettings) -> None:
        super().__init__(store)
        self.dropped: list[set[Wake]] = []

    def notify(self, wakes: Collection[Wake]) -> None:
        self.dropped.append(set(wakes))


async def test_rows_whose_wake_ups_are_lost_are_delivered_by_the_next_poll(pg_dsn: str) -> None:
    store = make_store(
        pg_dsn, lanes=8, poll_interval="0.3s", wake_linger="0s",
        transports={"memory": {"type": "memory"}}, default_transport="memory",
    )  # fmt: skip
    assert store.notify == "after_commit"
    await apply_schema(store)
    memory = MemoryTransport("memory")
    worker = Worker([store], transports={store.name: {"memory": memory}})
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    outbox = Outbox(store)
    dropped = Dropped(store)
    outbox._waker = Waker(store, notifier=dropped)
    try:
        await asyncio.wait_for(worker.started.wait(), 30)
        wakeups = worker.stores[store.name].relay.wakeups
        watch = wakeups.database.idle
        async with asyncio.timeout(30):  # idle: its database's idle watch polls for it
            while not wakeups.idle or wakeups.hot or watch.rounds < 2:
                await asyncio.sleep(0.05)
        assert wakeups.idle_poll_wait() == 0.3  # no idle doubling: wake-ups can be lost
        found_at: list[int] = []  # the poll whose probe found rows
        woken = wakeups._woken

        def recorded(heads: list[LaneHead]) -> None:
            if heads and not found_at:
                found_at.append(wakeups.polls)
            woken(heads)

        wakeups._woken = recorded  # type: ignore[method-assign]
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            for number in range(ROWS):
                await outbox.write_async(
                    conn, destination="events", body=str(number).encode(), key=f"k{number}"
                )
            await conn.commit()
            committed_at = wakeups.polls
        async with asyncio.timeout(60):
            while len(memory.received("events")) < ROWS:
                await asyncio.sleep(0.02)
        async with asyncio.timeout(30):
            while not dropped.dropped:  # the after-commit wake-up was tried, and lost
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task
        outbox.flush()
    # Found by the first poll after the commit, or the second when the commit came between
    # the first one's count and its probe.
    assert found_at and 1 <= found_at[0] - committed_at <= 2, (committed_at, found_at)


async def test_idle_stores_of_one_database_are_polled_together(pg_dsn: str) -> None:
    """Idle stores whose wake-ups can be lost wait in their database's idle watch: every
    round asks all of them in one statement and wakes only the store that holds a row; the
    others are not polled one by one (their poll counts stay)."""
    stores = [
        make_store(
            pg_dsn,
            name=f"idle{number}",
            table_prefix=f"idle{number}_",
            lanes=4,
            poll_interval="0.3s",
            transports={"memory": {"type": "memory"}},
            default_transport="memory",
        )
        for number in range(4)
    ]
    for store in stores:
        await apply_schema(store)
    memory = MemoryTransport("memory")
    worker = Worker(stores, transports={store.name: {"memory": memory} for store in stores})
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    outbox = Outbox(stores[0])
    dropped = Dropped(stores[0])
    outbox._waker = Waker(stores[0], notifier=dropped)  # only the poll can find the row
    try:
        await asyncio.wait_for(worker.started.wait(), 30)
        wakeups = [worker.stores[store.name].relay.wakeups for store in stores]
        watch = wakeups[0].database.idle
        assert all(each.database.idle is watch for each in wakeups)
        async with asyncio.timeout(30):  # every store idle, waiting in one round
            while not all(each.idle and not each.hot for each in wakeups) or watch.waiting(
                0.3
            ) < len(stores):
                await asyncio.sleep(0.02)
        polls = [each.polls for each in wakeups]
        rounds = watch.rounds
        async with asyncio.timeout(30):
            while watch.rounds < rounds + 3:
                await asyncio.sleep(0.02)
        assert [each.polls for each in wakeups] == polls  # no store polled on its own
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            await outbox.write_async(conn, destination="events", body=b"late", key="k")
            await conn.commit()
        async with asyncio.timeout(60):
            while not memory.received("events"):
                await asyncio.sleep(0.02)
        assert [each.polls for each in wakeups[1:]] == polls[1:]  # only its store was woken
        assert wakeups[0].polls > polls[0]
    finally:
        stop.set()
        await task


async def test_rows_a_quiet_writer_does_not_notify_are_found_by_the_hot_store(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After notifying a store, a writer's process stays quiet towards it for WAKE_QUIET; the
    workers, woken, poll the store's lanes hot (every HOT_POLL) for HOT_HOLD after each
    notification, so the rows of the quiet time are found without the fallback poll. (Both
    windows stretched here, so that a slow machine cannot end them between two writes.)"""
    monkeypatch.setattr(waker_module, "WAKE_QUIET", 30.0)
    monkeypatch.setattr(wakeups_module, "HOT_HOLD", 60.0)
    store = make_store(
        pg_dsn, lanes=8, poll_interval="20s", lease_duration="90s", wake_linger="0s",
        transports={"memory": {"type": "memory"}}, default_transport="memory",
    )  # fmt: skip
    await apply_schema(store)
    memory = MemoryTransport("memory")
    worker = Worker([store], transports={store.name: {"memory": memory}})
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    outbox = Outbox(store)
    try:
        await asyncio.wait_for(worker.started.wait(), 30)
        wakeups = worker.stores[store.name].relay.wakeups
        sent = outbox.waker.notifier.sent
        polls = wakeups.polls
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            for number in range(3):
                await outbox.write_async(conn, destination="events", body=b"x", key=f"q{number}")
                await conn.commit()
                await asyncio.to_thread(outbox.flush)  # its wake-up went out, or stayed quiet
        async with asyncio.timeout(60):
            while len(memory.received("events")) < 3:
                await asyncio.sleep(0.02)
        assert outbox.waker.notifier.sent == sent + 1  # the first commit's only
        assert wakeups.hot_polls > 0
        assert wakeups.polls == polls  # no fallback poll was needed
    finally:
        stop.set()
        await task
