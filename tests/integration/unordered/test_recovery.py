"""Recovery of unordered rows an application did not send: only past the grace period, in
parallel without sending a row twice, never waiting for lanes, with backoff on failure."""

from __future__ import annotations

import asyncio
import gc
from uuid import UUID

import psycopg
import pytest

from relayer import Outbox, OutboxMessage
from relayer.relay.unordered import UnorderedResult, UnorderedSender
from relayer.settings import StoreSettings
from relayer.transports.memory import MemoryTransport
from relayer.transports.routing import Routing
from tests.integration.unordered.helpers import backdate, memory_store, rows


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    return await memory_store(pg_dsn)


async def started(name: str = "memory") -> MemoryTransport:
    transport = MemoryTransport(name)
    await transport.start()
    return transport


def write_unordered(store: StoreSettings, count: int, key: str | None = None) -> list[UUID]:
    with psycopg.connect(store.require_dsn()) as conn:
        ids = Outbox(store).write_many(
            conn, [OutboxMessage("emails", f"{n}".encode(), key=key) for n in range(count)]
        )
        conn.commit()
    return ids


async def recover(
    store: StoreSettings, memory: MemoryTransport, limit: int = 100
) -> UnorderedResult:
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        return await UnorderedSender(store, Routing(store, {"memory": memory})).recover(conn, limit)


async def test_only_rows_past_the_grace_period_are_recovered(store: StoreSettings) -> None:
    memory = await started()
    crashed = write_unordered(store, 3)  # the application died before dispatching these
    backdate(store, crashed, seconds=31)  # unordered_grace is 30 s
    young = write_unordered(store, 2)  # these may still be dispatched by their application
    result = await recover(store, memory)
    assert result.sent == 3
    assert {message.id for message in memory.received("emails")} == set(crashed)
    assert set(rows(store)) == set(young)


async def test_parallel_recoveries_never_send_a_row_twice(store: StoreSettings) -> None:
    ids = write_unordered(store, 20)
    backdate(store, ids)
    first, second = await started(), await started()
    first.stall()  # the first recovery holds its claimed rows while waiting for the broker
    holding = asyncio.create_task(recover(store, first, limit=8))
    while len(first.published) < 8:
        await asyncio.sleep(0.01)
    other = await recover(store, second)  # skips the locked rows instead of waiting
    first.resume()
    held = await holding
    assert (held.sent, other.sent) == (8, 12)
    sent = [message.id for message in first.received("emails") + second.received("emails")]
    assert sorted(sent) == sorted(ids)  # each row exactly once
    assert rows(store) == {}


async def test_recovery_never_waits_for_lanes(store: StoreSettings) -> None:
    unordered = write_unordered(store, 4)
    ordered = write_unordered(store, 2, key="order-1")
    backdate(store, unordered + ordered)
    memory = await started()
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as lanes:
        # Every lane lease row locked, as by batches in flight on every lane.
        await lanes.execute(f"SELECT * FROM {store.table_prefix}leases FOR UPDATE")
        result = await asyncio.wait_for(recover(store, memory), 10)
        await lanes.rollback()
    assert result.sent == 4
    assert set(rows(store)) == set(ordered)  # ordered rows are the lanes' business


async def test_failures_back_off_and_are_retried(store: StoreSettings) -> None:
    ids = write_unordered(store, 3)
    backdate(store, ids)
    memory = await started()
    memory.fail_message(ids[0], message="broker said no")
    first = await recover(store, memory)
    assert (first.sent, first.failed) == (2, 1)
    attempts, error, retry_in = rows(store)[ids[0]]
    assert (attempts, error) == (1, "broker said no") and retry_in > 0
    assert (await recover(store, memory)).claimed == 0  # not before its retry time
    memory.clear_faults()
    with psycopg.connect(store.require_dsn()) as conn:
        conn.execute(f"UPDATE {store.table_prefix}outbox SET deliver_at = now()")
        conn.commit()
    assert (await recover(store, memory)).sent == 1
    assert rows(store) == {}


async def test_future_dated_rows_wait_for_their_time_not_the_grace(store: StoreSettings) -> None:
    with psycopg.connect(store.require_dsn()) as conn:
        due = conn.execute("SELECT now() - interval '1 second'").fetchone()
        future = conn.execute("SELECT now() + interval '1 hour'").fetchone()
        assert due is not None and future is not None
        outbox = Outbox(store)
        ready = outbox.write(conn, destination="emails", body=b"due", deliver_at=due[0])
        later = outbox.write(conn, destination="emails", body=b"later", deliver_at=future[0])
        conn.commit()
    memory = await started()
    result = await recover(store, memory)
    assert result.sent == 1
    assert [message.id for message in memory.received("emails")] == [ready]
    assert set(rows(store)) == {later}


async def test_a_long_failing_row_backs_off_at_most_retry_backoff_max(
    store: StoreSettings,
) -> None:
    [row] = write_unordered(store, 1)
    backdate(store, [row])
    with psycopg.connect(store.require_dsn()) as conn:
        conn.execute(f"UPDATE {store.table_prefix}outbox SET attempts = 100000")
        conn.commit()
    memory = await started()
    memory.fail_message(row)
    assert (await recover(store, memory)).failed == 1  # no interval overflow
    attempts, _, retry_in = rows(store)[row]
    assert attempts == 100001 and 3000 < retry_in <= 3600


async def test_acknowledgements_left_behind_by_a_stopped_recovery_are_never_reported(
    store: StoreSettings,
) -> None:
    """The worker stops (the recovery job is cancelled) while the broker holds the outcomes;
    when they fail later, asyncio must not report one unretrieved exception per row."""
    reports: list[str] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda loop, context: reports.append(context["message"])
    )
    ids = write_unordered(store, 50)
    backdate(store, ids)
    memory = await started()
    memory.stall()  # published, outcomes held
    recovery = asyncio.ensure_future(recover(store, memory))
    for _ in range(500):
        if len(memory.published) == 50:
            break
        await asyncio.sleep(0.01)
    recovery.cancel()
    with pytest.raises(asyncio.CancelledError):
        await recovery
    memory.disconnect()  # the held outcomes fail now
    del recovery
    gc.collect()
    await asyncio.sleep(0.05)
    assert reports == []
    assert len(rows(store)) == 50  # nothing lost: recovered again later
