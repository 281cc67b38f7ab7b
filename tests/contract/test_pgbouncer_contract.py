"""Writers and a worker through PgBouncer in transaction mode, over every transport: two
server connections per database and DISCARD ALL whenever one changes hands, so that any
session state relayer relied on (a prepared statement, a SET, a LISTEN, a session lock) would
fail here. Rows from several writer connections, each past psycopg's prepare threshold, reach
the consumer complete and in per-key order, with nothing rolled back on the way. On each path of
relayer.store.wire (libpq's pipeline, psycopg's cursors)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import psycopg
import pytest

from relayer import Outbox, OutboxMessage
from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.base import Transport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.contract.brokers import Broker
from tests.integration.relay.helpers import pending
from tests.pgbouncer import PgBouncer

KEYS = 12
CLIENTS = 4
TRANSACTIONS = 24  # six per client: past the prepare threshold of each statement
ROWS = 5


class Shared:
    """The test's transport, lent to a worker that must neither start nor close it."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


async def write_from_clients(store: StoreSettings, destination: str) -> int:
    outbox = Outbox(store)
    conns = [await psycopg.AsyncConnection.connect(store.require_dsn()) for _ in range(CLIENTS)]
    sequence: dict[str, int] = {}
    try:
        for number in range(TRANSACTIONS):
            messages = []
            for row in range(ROWS):
                key = f"key-{(number * ROWS + row) % KEYS}"
                messages.append(
                    OutboxMessage(destination, f"{key}#{sequence.get(key, 0)}".encode(), key=key)
                )
                sequence[key] = sequence.get(key, 0) + 1
            conn = conns[number % CLIENTS]  # interleaved: the clients share server connections
            await outbox.write_many_async(conn, messages)
            await conn.commit()
    finally:
        for conn in conns:
            await conn.close()
    return TRANSACTIONS * ROWS


@pytest.mark.usefixtures("wire_path")
async def test_written_and_relayed_through_pgbouncer(
    broker: Broker,
    transport: Transport,
    pg_dsn: str,
    pgbouncer_strict: PgBouncer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    direct = make_store(pg_dsn, lanes=8)
    await apply_schema(direct)
    store = make_store(
        pgbouncer_strict.dsn_for(pg_dsn),
        pooler="transaction",
        lanes=8,
        lease_duration="10s",
        poll_interval="0.2s",
        transports={transport.name: {"type": "memory"}},  # the name rows refer to
        default_transport=transport.name,
    )
    destination = await broker.destination()
    caplog.set_level(logging.INFO, logger="relayer")
    worker = Worker(
        [store],
        transports={store.name: {transport.name: Shared(transport)}},  # type: ignore[dict-item]
        settings=WorkerSettings(pool_size=4),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.started.wait(), 15)
        written = await write_from_clients(store, destination)
        deadline = time.monotonic() + 60
        while pending(direct) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
    assert pending(direct) == 0
    received = await broker.consume(destination, written)
    sequences: dict[str, list[int]] = {}
    for message in received:
        key, number = message.body.decode().rsplit("#", 1)
        sequences.setdefault(key, []).append(int(number))
    per_key = written // KEYS
    assert sequences == {f"key-{n}": list(range(per_key)) for n in range(KEYS)}
    stats = worker.stores[store.name].relay.stats
    assert (stats.sent, stats.rollbacks, stats.last_error) == (written, 0, "")
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
