"""Relay throughput: one worker, 64 lanes, 200-byte rows over 10,000 keys.

    python bench/relay.py [--rows 100000] [--baseline-rows 10000]
    python bench/relay.py --transport kafka [--kafka-bootstrap HOST:PORT]
    python bench/relay.py --transport rabbitmq [--rabbitmq-url URL] [--rows 20000]

Measures, in one run against the same PostgreSQL:
- relayer: a Worker (default settings) draining a pre-filled outbox through the transport;
- with ``--transport memory`` (default), the per-row baseline the reference relay describes:
  per lane, in a transaction holding the lane lock, each row gets a conditional claim UPDATE, a
  sequential send awaited to its acknowledgement, and a fenced DELETE;
- with ``--transport kafka|rabbitmq``, the bare producer (confluent-kafka with the same
  settings, or an aio-pika pipelined publisher with confirms) sending the same messages from
  memory, in ``--rounds`` rounds that alternate relay and bare runs; the ratio is that of the
  medians. Kafka is an embedded tansu broker unless a bootstrap server is given.
Prints rows/s and the ratio. Never asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from bench.common import machine, postgres, scratch_schema, server_version
from relayer import Outbox, OutboxMessage
from relayer.lanes import UNORDERED_LANE
from relayer.operations import schema
from relayer.settings import StoreSettings, WorkerSettings, store_settings
from relayer.store import RelayStore
from relayer.transports.base import Transport
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker

BODY = b"x" * 200
KEYS = 10_000
LANES = 64

# The baseline's per-row statements (the pattern relayer replaces with set-based work).
CLAIM = (
    "UPDATE {outbox} SET attempts = attempts WHERE id = %(id)s AND lane = %(lane)s "
    "AND EXISTS (SELECT 1 FROM {leases} WHERE lane = %(lane)s AND token = %(token)s) "
    "RETURNING id"
)
DELETE = (
    "DELETE FROM {outbox} WHERE lane = %(lane)s AND id = %(id)s "
    "AND EXISTS (SELECT 1 FROM {leases} WHERE lane = %(lane)s AND token = %(token)s)"
)


def make_store(
    dsn: str,
    schema_name: str,
    transport: dict[str, Any] | None = None,
    *,
    notify: bool = False,
    name: str = "bench",
    lanes: int = LANES,
    **settings: Any,
) -> StoreSettings:
    """A store of ``lanes`` lanes in ``schema_name``; ``settings``: any other store setting."""
    return store_settings(
        name=name,
        dsn=dsn,
        schema=schema_name,
        table_prefix="r_",
        lanes=lanes,
        poll_interval="0.2s",
        notify=notify,
        transports={"broker": transport or {"type": "memory"}},
        default_transport="broker",
        **settings,
    )


async def fill(store: StoreSettings, rows: int, destination: str = "events") -> None:
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        await write_backlog(conn, store, rows, destination, commit=True)


async def write_backlog(
    conn: psycopg.AsyncConnection[Any],
    store: StoreSettings,
    rows: int,
    destination: str,
    *,
    commit: bool,
) -> None:
    """Write ``rows`` 200-byte rows over KEYS keys in batches of 5,000, each committed if
    ``commit``, else all left in the caller's open transaction."""
    outbox = Outbox(store)
    for start in range(0, rows, 5_000):
        count = min(5_000, rows - start)
        messages = [
            OutboxMessage(destination, BODY, key=f"key-{(start + index) % KEYS}")
            for index in range(count)
        ]
        await outbox.write_many_async(conn, messages)
        if commit:
            await conn.commit()


async def outbox_empty(conn: psycopg.AsyncConnection[Any], store: StoreSettings) -> bool:
    """Whether ``store``'s outbox holds no row: one look from the start (DrainWatch)."""
    return await DrainWatch(store).empty(conn)


class DrainWatch:
    """Whether an outbox that nobody writes to any more is empty yet, each look starting at the
    first row the previous look found (the first look, below every row: lanes start at -1,
    UNORDERED_LANE, and no id sorts before the nil UUID).

    Through the primary key, in its order: the entries of deleted rows are marked dead as the
    scan passes them. A plain LIMIT 1 walked the heap past every row deleted since the last
    vacuum (14 ms a look near the end of a drain, every 20 ms: the monitor took a third of a
    core from the relay it measured). A drain only deletes, so the row a look found is a lower
    bound of every row left, and the next look steps only over the entries of rows deleted
    since: from the start each time, a look walked every dead entry of the drain so far (with
    65,536 lanes, 15 ms a look every 20 ms near the end).

    Only valid when every row was committed before the first look (a row written later may
    sort before the bound and never be seen): make a new watch for each drain."""

    def __init__(self, store: StoreSettings) -> None:
        table = psycopg.sql.Identifier(store.db_schema, store.names.table("outbox"))
        self._look = psycopg.sql.SQL(
            "SELECT lane, id FROM {} WHERE (lane, id) >= (%s, %s) ORDER BY lane, id LIMIT 1"
        ).format(table)
        self._bound: tuple[int, uuid.UUID] = (UNORDERED_LANE, uuid.UUID(int=0))
        self._partitioned: psycopg.sql.Composed | None = None
        if store.storage == "partitioned":  # sent rows stay: a lane is empty at its progress
            names = store.names
            self._partitioned = psycopg.sql.SQL(
                "SELECT -1, NULL WHERE EXISTS (SELECT 1 FROM {held}) OR EXISTS (SELECT 1 FROM "
                "{progress} AS g WHERE EXISTS (SELECT 1 FROM {outbox} AS o WHERE o.lane = g.lane "
                "AND o.id > g.done_id))"
            ).format(
                held=psycopg.sql.Identifier(names.schema, names.table("held")),
                progress=psycopg.sql.Identifier(names.schema, names.table("progress")),
                outbox=table,
            )

    async def empty(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        if self._partitioned is not None:
            cursor = await conn.execute(self._partitioned)
            return await cursor.fetchone() is None
        cursor = await conn.execute(self._look, self._bound)
        row = await cursor.fetchone()
        if row is None:
            return True
        self._bound = (row[0], row[1])
        return False


async def pending(store: StoreSettings) -> bool:
    """Whether ``store``'s outbox holds a row (a connection of its own)."""
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        return not await outbox_empty(conn, store)


async def relayer_rate(
    store: StoreSettings, transport: Transport | None, rows: int, destination: str = "events"
) -> float:
    """Rows/s of one Worker draining ``rows`` pre-filled rows (its own transports if None)."""
    await fill(store, rows, destination)
    transports = None if transport is None else {store.name: {"broker": transport}}
    worker = Worker([store], transports=transports, settings=WorkerSettings())
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(worker.run(stop))
    while await pending(store):
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - started
    stop.set()
    await task
    return rows / elapsed


async def baseline_rate(store: StoreSettings, transport: Transport, rows: int) -> float:
    """The per-row pattern: claim UPDATE + send awaited + fenced DELETE, one row at a time."""
    await fill(store, rows)
    ids = {
        "outbox": f'"{store.db_schema}"."{store.names.table("outbox")}"',
        "leases": f'"{store.db_schema}"."{store.names.table("leases")}"',
    }
    claim, delete = CLAIM.format(**ids), DELETE.format(**ids)
    db = RelayStore(store)
    sent = 0
    started = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        while sent < rows:
            for lane in range(LANES):
                tokens, batch = await db.lock_and_read(conn, [lane], "baseline", uuid.uuid4(), 100)
                token = tokens.get(lane)
                if token is None:
                    await conn.rollback()
                    continue
                rows_read = batch.batch  # LaneRows: columns, one lane here
                for index in range(len(rows_read)):
                    message = rows_read.message(index)
                    params: dict[str, Any] = {"id": message.id, "lane": lane, "token": token}
                    claimed = await conn.execute(claim, params)  # type: ignore[arg-type]
                    if await claimed.fetchone() is None:
                        continue
                    await (await transport.publish(message))
                    await conn.execute(delete, params)  # type: ignore[arg-type]
                    sent += 1
                await conn.commit()
    return sent / (time.perf_counter() - started)


async def memory_run(dsn: str, arguments: argparse.Namespace) -> None:
    with scratch_schema(dsn, "relay") as schema_name:
        store = await applied(make_store(dsn, schema_name))
        transport = MemoryTransport("broker")
        rate = await relayer_rate(store, transport, arguments.rows)
        received = len(transport.received("events"))
        print(
            f"relayer:  {rate:>10,.0f} rows/s  ({arguments.rows:,} rows, {LANES} lanes, "
            f"{KEYS:,} keys, batch {store.batch_size}, {received:,} messages received)"
        )
        baseline_transport = MemoryTransport("broker")
        await baseline_transport.start()
        base = await baseline_rate(store, baseline_transport, arguments.baseline_rows)
        print(f"baseline: {base:>10,.0f} rows/s  ({arguments.baseline_rows:,} rows, per-row)")
        print(f"relayer / per-row baseline = {rate / base:.1f}x")


async def interleaved(
    arguments: argparse.Namespace,
    relayed: Callable[[], Awaitable[float]],
    bare: Callable[[], Awaitable[float]],
    labels: tuple[str, str],
) -> None:
    """Alternate relay and bare runs (the order swapped every round, so drift in the machine's
    speed hits both alike), print each round, then the medians and the ratio of the medians."""
    rates: dict[str, list[float]] = {"relay": [], "bare": []}
    for round_number in range(1, arguments.rounds + 1):
        order = ("relay", "bare") if round_number % 2 else ("bare", "relay")
        for kind in order:
            rates[kind].append(await (relayed if kind == "relay" else bare)())
        ratio = rates["relay"][-1] / rates["bare"][-1]
        print(
            f"round {round_number}: {labels[0]} {rates['relay'][-1]:>9,.0f} msg/s, "
            f"{labels[1]} {rates['bare'][-1]:>9,.0f} msg/s, ratio {ratio:.2f}x",
            flush=True,
        )
    relay, bare_rate = statistics.median(rates["relay"]), statistics.median(rates["bare"])
    ratios = [r / b for r, b in zip(rates["relay"], rates["bare"], strict=True)]
    print(f"{labels[0]}: {relay:>10,.0f} msg/s median ({arguments.rows:,} rows, {LANES} lanes)")
    print(f"{labels[1]}: {bare_rate:>10,.0f} msg/s median (same messages, from memory)")
    print(
        f"relayer / bare = {relay / bare_rate:.2f}x (ratio of the medians; per round "
        f"{min(ratios):.2f}-{max(ratios):.2f}x over {arguments.rounds} rounds)"
    )


async def kafka_run(dsn: str, arguments: argparse.Namespace) -> None:
    from bench.transport_bare import bare_kafka, create_topic, kafka_cluster, messages

    with kafka_cluster(arguments.kafka_bootstrap) as bootstrap:
        topic = create_topic(bootstrap)

        async def relayed() -> float:
            with scratch_schema(dsn, "relay") as schema_name:
                options = {"type": "kafka", "bootstrap.servers": bootstrap}
                store = await applied(make_store(dsn, schema_name, options))
                return await relayer_rate(store, None, arguments.rows, topic)

        async def bare() -> float:
            batch = messages(arguments.rows, KEYS, topic)
            seconds: float = await asyncio.to_thread(bare_kafka, bootstrap, topic, batch)
            return arguments.rows / seconds

        await interleaved(arguments, relayed, bare, ("relayer -> Kafka", "bare confluent-kafka"))


async def rabbitmq_run(dsn: str, arguments: argparse.Namespace) -> None:
    from bench.transport_bare import bare_rabbitmq, messages, with_queue

    url = arguments.rabbitmq_url

    async def relayed_to(queue: str) -> float:
        with scratch_schema(dsn, "relay") as schema_name:
            options = {"type": "rabbitmq", "url": url}
            store = await applied(make_store(dsn, schema_name, options))
            return await relayer_rate(store, None, arguments.rows, "/" + queue)

    async def bare_to(queue: str) -> float:
        seconds = await bare_rabbitmq(url, queue, messages(arguments.rows, KEYS, ""))
        return arguments.rows / seconds

    await interleaved(
        arguments,
        lambda: with_queue(url, relayed_to),
        lambda: with_queue(url, bare_to),
        ("relayer -> RabbitMQ", "bare aio-pika (pipelined confirms)"),
    )


async def applied(store: StoreSettings) -> StoreSettings:
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        await schema.apply(conn, store)
    return store


async def main_async(arguments: argparse.Namespace) -> None:
    with postgres(arguments.dsn) as dsn:
        print(f"machine: {machine()}; {server_version(dsn)}")
        runs = {"memory": memory_run, "kafka": kafka_run, "rabbitmq": rabbitmq_run}
        await runs[arguments.transport](dsn, arguments)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--baseline-rows", type=int, default=10_000)
    parser.add_argument("--transport", choices=("memory", "kafka", "rabbitmq"), default="memory")
    parser.add_argument("--kafka-bootstrap", help="default: an embedded tansu broker")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument(
        "--rounds", type=int, default=3, help="kafka/rabbitmq: relay and bare runs alternated"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
