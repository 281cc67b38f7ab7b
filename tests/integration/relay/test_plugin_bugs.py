"""A plug-in transport whose ``publish`` or ``publish_batch`` raises an exception the transport
contract does not name (a bug of the plug-in) fails only the rows it was given: an ordered row's
key is parked with the error, an unordered row gets an attempt and the error and is retried
later, the same on every path, and the other transports' rows are sent as usual."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
import pytest

from relayer import Outbox
from relayer.settings import StoreSettings
from relayer.transports.base import OutboundBatch, OutgoingMessage, Settle
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import parked

BUG = "the plug-in's own bug"


class BuggyPublish:
    """A plug-in transport that only has ``publish``, and whose ``publish`` raises."""

    pipelines_within_key = False

    def __init__(self, name: str) -> None:
        self._name = name
        self.calls = 0

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> None:
        pass

    async def ordered_by_key(self, destination: str) -> bool:
        return True

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        self.calls += 1
        raise RuntimeError(BUG)

    async def close(self) -> None:
        pass


class BuggyPublishBatch(BuggyPublish):
    """A plug-in transport that publishes in batches, and whose ``publish_batch`` raises."""

    async def publish_batch(
        self,
        batch: OutboundBatch,
        indexes: Sequence[int],
        settle: Settle,
        admitting: Callable[[], bool],
    ) -> int:
        self.calls += 1
        raise RuntimeError(BUG)


def buggy_store(pg_dsn: str) -> StoreSettings:
    return make_store(
        pg_dsn,
        lanes=4,
        poll_interval="0.1s",
        unordered_grace="0s",
        maintenance_interval="0.1s",
        transports={"memory": {"type": "memory"}, "buggy": {"type": "memory"}},
        default_transport="memory",
    )


async def rows(store: StoreSettings, **where: Any) -> list[tuple[Any, ...]]:
    """(ordering_key, attempts, last_error) of the outbox rows still there."""
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        cursor = await conn.execute(
            f"SELECT ordering_key, attempts, last_error FROM {store.table_prefix}outbox ORDER BY id"
        )
        return await cursor.fetchall()


async def until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait for ``condition`` (a generous bound: only a broken relay ever reaches it)."""
    async with asyncio.timeout(60):
        while not await condition():
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("plugin", [BuggyPublish, BuggyPublishBatch], ids=["publish", "batch"])
async def test_a_plugin_that_raises_parks_only_its_rows_keys_with_the_error(
    pg_dsn: str, plugin: type[BuggyPublish]
) -> None:
    store = buggy_store(pg_dsn)
    await apply_schema(store)
    buggy = plugin("buggy")
    memory = MemoryTransport("memory")
    outbox = Outbox(store)
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        await outbox.write_async(
            conn, destination="events", body=b"1", key="doomed", transport="buggy"
        )
        await outbox.write_async(
            conn, destination="events", body=b"2", key="doomed", transport="buggy"
        )
        await outbox.write_async(conn, destination="events", body=b"3", key="fine")
        await outbox.write_async(conn, destination="events", body=b"4", transport="buggy")
        await conn.commit()
    worker = Worker([store], transports={store.name: {"memory": memory, "buggy": buggy}})
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:

        async def settled() -> bool:
            left = await rows(store)
            unordered = [row for row in left if row[0] is None]
            return "doomed" in parked(store) and bool(unordered) and unordered[0][1] >= 1

        await until(settled, "the buggy rows to fail")
        assert not task.done()  # the worker itself carries on
    finally:
        stop.set()
        await task
    attempts, error, waits_for_operator = parked(store)["doomed"]
    assert (attempts, waits_for_operator) == (1, False)  # retried later, like any failure
    assert error == f"RuntimeError: {BUG}"
    left = await rows(store)
    assert [row[0] for row in left] == ["doomed", "doomed", None]  # the key's rows stay
    assert left[2][2] == f"RuntimeError: {BUG}"  # the unordered row: its attempt and error
    assert [message.body for message in memory.received("events")] == [b"3"]
    assert buggy.calls >= 2  # both the ordered and the unordered row were handed to it
