"""Stopping a worker while its broker acknowledges nothing (issue 13, item 2): the stop is
bounded by lease_duration / 2 whatever the broker does, and the rows it did not get an
acknowledgement for stay for the next owner, with no attempt counted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

import psycopg
import pytest

from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.base import OutgoingMessage
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import keys_in_lane, parked, pending, write

LEASE = 2.0
# Scheduling slack on a busy machine, beyond the bound itself.
SLACK = 0.5


class SilentBroker:
    """A plug-in transport in front of a stalled MemoryTransport whose ``close`` never returns
    (a broker that does not answer the connection's close either), and no ``close_within``."""

    def __init__(self, broker: MemoryTransport) -> None:
        self.broker = broker
        self.close_called = False

    @property
    def name(self) -> str:
        return self.broker.name

    @property
    def pipelines_within_key(self) -> bool:
        return self.broker.pipelines_within_key

    async def start(self) -> None:
        await self.broker.start()

    async def ordered_by_key(self, destination: str) -> bool:
        return await self.broker.ordered_by_key(destination)

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        return await self.broker.publish(message)

    async def close(self) -> None:
        self.close_called = True
        await asyncio.Event().wait()


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    settings = make_store(
        pg_dsn,
        lanes=4,
        batch_size=50,
        lease_duration=f"{LEASE}s",
        poll_interval="0.1s",
        retry_backoff="0.2s",
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(settings)
    return settings


def attempts_and_leases(store: StoreSettings, member: str) -> tuple[int, int]:
    """(the most attempts of any row, live leases of ``member``: lanes and membership)."""
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(
            f"SELECT (SELECT coalesce(max(attempts), 0) FROM {store.table_prefix}outbox), "
            f"(SELECT count(*) FROM {store.table_prefix}leases "
            "WHERE owner LIKE %s AND expires_at > now())",
            (f"%{member}%",),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def test_a_stop_while_the_broker_is_silent_ends_within_half_a_lease(
    store: StoreSettings,
) -> None:
    written = 0
    for lane in range(store.lanes):
        written += len(write(store, keys_in_lane(store, lane, 5), per_key=4))
    memory = MemoryTransport("memory")
    memory.stall()
    broker = SilentBroker(memory)
    worker = Worker(
        [store],
        transports={store.name: {"memory": broker}},
        settings=WorkerSettings(pool_size=4),
        instance_id="stopping-member",
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await asyncio.wait_for(worker.started.wait(), 10)
    deadline = time.monotonic() + 10
    while not memory.received_all() and time.monotonic() < deadline:  # batches in flight
        await asyncio.sleep(0.01)
    assert memory.received_all(), "no batch started"
    await asyncio.sleep(0.2)  # a batch in flight now waits for acknowledgements in vain
    stopped_at = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, 10)
    elapsed = time.monotonic() - stopped_at
    assert elapsed <= LEASE / 2 + SLACK, elapsed  # an acceptance bound of the issue
    assert broker.close_called
    assert pending(store) == written  # nothing acknowledged, nothing deleted
    assert parked(store) == {}
    assert attempts_and_leases(store, "stopping-member") == (0, 0)  # lanes released, left
