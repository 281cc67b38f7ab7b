"""The end-to-end demo behind ``make demo`` / ``relayer demo``.

It uses a configured PostgreSQL (``--dsn`` or ``RELAYER_DSN``) or starts an embedded one, and a
configured Kafka (``--kafka-bootstrap``) or the embedded Kafka-protocol broker. It applies the
schema of a demo store, starts two workers, writes sample orders with their outbox rows in the
same transactions while the workers relay them, shows progress, then consumes the topic back
and checks that every order arrived and that each customer's events arrived in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from psycopg import sql

from relayer.errors import RelayerError
from relayer.lanes import lane_for
from relayer.operations import schema
from relayer.operations.status import read_status
from relayer.settings import StoreSettings, WorkerSettings, store_settings
from relayer.store.driver import connect
from relayer.worker import Worker
from relayer.writer.messages import OutboxMessage
from relayer.writer.outbox import Outbox

DEMO_SCHEMA = "relayer_demo"
Say = Callable[[str], None]


class DemoError(RelayerError):
    """The demo found a lost or out-of-order event (it should never happen)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    customer: str
    sequence: int
    order_id: int


@contextlib.asynccontextmanager
async def demo_database(dsn: str | None, say: Say) -> AsyncIterator[str]:
    """The configured DSN, or an embedded PostgreSQL for the duration of the demo."""
    if dsn:
        yield dsn
        return
    from relayer.embedded import EmbeddedPostgres

    say("starting an embedded PostgreSQL (no DSN configured) ...")
    with EmbeddedPostgres() as server:
        say(f"  PostgreSQL on 127.0.0.1:{server.port}")
        yield server.dsn


@contextlib.contextmanager
def demo_broker(bootstrap: str | None, say: Say) -> Iterator[str]:
    """The configured Kafka bootstrap servers, or the embedded Kafka-protocol broker."""
    if bootstrap:
        yield bootstrap
        return
    from relayer.embedded import EmbeddedKafka

    say("starting the embedded Kafka-protocol broker (tansu) ...")
    with EmbeddedKafka() as broker:
        say(f"  Kafka protocol on {broker.bootstrap_servers}")
        yield broker.bootstrap_servers


def demo_store(dsn: str, bootstrap: str, lanes: int = 16) -> StoreSettings:
    return store_settings(
        name="demo",
        dsn=dsn,
        schema=DEMO_SCHEMA,
        table_prefix="orders_",
        lanes=lanes,
        lease_duration="10s",
        poll_interval="0.5s",
        transports={"kafka": {"type": "kafka", "bootstrap.servers": bootstrap}},
        default_transport="kafka",
    )


async def prepare(store: StoreSettings) -> schema.ApplyResult:
    """Reset the demo's own schema, apply the store's tables and create the business table."""
    async with await connect(store, purpose="demo") as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(DEMO_SCHEMA))
        )
        result = await schema.apply(conn, store)
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, customer text NOT NULL, "
                "amount_cents integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(DEMO_SCHEMA, "orders"))
        )
    return result


def create_topic(bootstrap: str, partitions: int = 8) -> str:
    """A new topic for this run, so a second run never reads the first one's events."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"relayer-demo-orders-{time.strftime('%Y%m%d-%H%M%S')}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    return topic


class OrderWriter:
    """Writes orders and their outbox rows in the same transactions, numbering each
    customer's events so the consumer can check their order."""

    def __init__(self, store: StoreSettings, topic: str, customers: int) -> None:
        self.store = store
        self.topic = topic
        self.customers = customers
        self.outbox = Outbox(store)
        self.rng = random.Random(7)
        self.sequence: dict[str, int] = {}
        self.written = 0
        self.per_lane: dict[int, int] = {}
        self.table = sql.Identifier(DEMO_SCHEMA, "orders")

    def _next(self) -> tuple[int, str, int, OutboxMessage]:
        self.written += 1
        customer = f"customer-{self.rng.randrange(self.customers):03d}"
        lane = lane_for(customer, self.store.lanes)
        self.per_lane[lane] = self.per_lane.get(lane, 0) + 1
        self.sequence[customer] = self.sequence.get(customer, 0) + 1
        amount = self.rng.randrange(100, 50_000)
        event = {
            "type": "OrderPlaced",
            "order_id": self.written,
            "customer": customer,
            "sequence": self.sequence[customer],
            "amount_cents": amount,
        }
        message = OutboxMessage(
            self.topic,
            json.dumps(event).encode(),
            key=customer,
            headers={"event-type": "OrderPlaced"},
        )
        return self.written, customer, amount, message

    async def one_per_transaction(self, orders: int) -> None:
        insert = sql.SQL("INSERT INTO {} (id, customer, amount_cents) VALUES (%s, %s, %s)")
        async with await connect(self.store, autocommit=False, purpose="demo-writer") as conn:
            for _ in range(orders):
                order_id, customer, amount, message = self._next()
                await conn.execute(insert.format(self.table), (order_id, customer, amount))
                await self.outbox.write_many_async(conn, [message])
                await conn.commit()

    async def in_batches(self, orders: int, per_transaction: int = 1000) -> None:
        copy = sql.SQL("COPY {} (id, customer, amount_cents) FROM STDIN").format(self.table)
        async with await connect(self.store, autocommit=False, purpose="demo-writer") as conn:
            for start in range(0, orders, per_transaction):
                rows = [self._next() for _ in range(min(per_transaction, orders - start))]
                async with conn.cursor() as cursor, cursor.copy(copy) as stream:
                    for order_id, customer, amount, _ in rows:
                        await stream.write_row((order_id, customer, amount))
                await self.outbox.write_many_async(conn, [row[3] for row in rows])
                await conn.commit()


def consume(bootstrap: str, topic: str, expected: int) -> list[Delivery]:
    """Read the whole topic back (every partition from the start).

    From offset 0, not OFFSET_BEGINNING: the embedded broker answers the EARLIEST offset with
    the batch it wrote first, not the lowest offset, so a read from OFFSET_BEGINNING could
    start past a large batch of events whose write ended after that of a later one and report
    them lost. A Kafka log that starts above 0 is read from its start (auto.offset.reset)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"relayer-demo-{time.time_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    deliveries: list[Delivery] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, number, 0) for number in partitions])
        idle = 0.0
        while len(deliveries) < expected and idle < 10:
            batch = consumer.consume(1000, timeout=0.5)
            idle = 0.0 if batch else idle + 0.5
            for record in batch:
                if record.error() is None:
                    event: dict[str, Any] = json.loads(record.value() or b"{}")
                    deliveries.append(
                        Delivery(event["customer"], event["sequence"], event["order_id"])
                    )
    finally:
        consumer.close()
    return deliveries


def verify(deliveries: list[Delivery], orders: int) -> tuple[int, int]:
    """(distinct orders, duplicates); raises DemoError on a lost or out-of-order event."""
    seen: set[int] = set()
    last: dict[str, int] = {}
    duplicates = 0
    for delivery in deliveries:
        if delivery.order_id in seen:
            duplicates += 1
            continue
        seen.add(delivery.order_id)
        if delivery.sequence != last.get(delivery.customer, 0) + 1:
            raise DemoError(
                f"{delivery.customer}: event {delivery.sequence} arrived after "
                f"{last.get(delivery.customer, 0)}"
            )
        last[delivery.customer] = delivery.sequence
    if len(seen) != orders:
        raise DemoError(f"{orders - len(seen)} of {orders} orders never reached Kafka")
    return len(seen), duplicates


async def progress(
    store: StoreSettings, writer: OrderWriter, say: Say, done: asyncio.Event
) -> None:
    async with await connect(store, purpose="demo-progress") as conn:
        while not done.is_set():
            status = await read_status(conn, store)
            say(
                f"  written {writer.written:>7,}   pending {status.total_pending:>7,}   "
                f"oldest pending {status.oldest_age_seconds:6.2f} s"
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 1.0)


async def drained(store: StoreSettings) -> None:
    async with await connect(store, purpose="demo-progress") as conn:
        while (await read_status(conn, store)).total_pending:  # noqa: ASYNC110 - a database poll
            await asyncio.sleep(0.05)


async def run_demo(
    dsn: str | None,
    bootstrap: str | None,
    *,
    live_orders: int,
    backlog_orders: int,
    customers: int,
    say: Say,
) -> None:
    async with demo_database(dsn, say) as database:
        with demo_broker(bootstrap, say) as servers:
            topic = await asyncio.to_thread(create_topic, servers)
            store = demo_store(database, servers)
            result = await prepare(store)
            say(
                f"store 'demo' ({DEMO_SCHEMA}.orders_*): schema version "
                f"{result.schema_version}, {result.lanes} lanes; Kafka topic {topic!r}"
            )
            workers = [
                Worker([store], settings=WorkerSettings(pool_size=8), instance_id=f"worker-{n}")
                for n in (1, 2)
            ]
            writer = OrderWriter(store, topic, customers)
            elapsed, lanes = await relay_orders(
                workers, writer, say, live_orders=live_orders, backlog_orders=backlog_orders
            )
            say(
                f"backlog written and relayed in {elapsed:.2f} s: "
                f"{backlog_orders / elapsed:,.0f} orders/s end to end"
            )
            say_lanes(writer, lanes, say)
            total = writer.written
            say(f"consuming the topic back ({total:,} events) ...")
            deliveries = await asyncio.to_thread(consume, servers, topic, total)
            distinct, duplicates = verify(deliveries, total)
            say(
                f"verified: {distinct:,} of {total:,} orders received, {duplicates} duplicates, "
                f"each of {customers} customers' events in order"
            )


async def relay_orders(
    workers: list[Worker],
    writer: OrderWriter,
    say: Say,
    *,
    live_orders: int,
    backlog_orders: int,
) -> tuple[float, dict[str, list[int]]]:
    """Run ``workers`` while ``writer`` writes live orders, then a backlog: the seconds the
    backlog took to be written and relayed, and the lanes each worker held at the end."""
    store = writer.store
    stop, done = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(worker.run(stop)) for worker in workers]
    reporter: asyncio.Task[None] | None = None
    try:
        for worker in workers:
            await asyncio.wait_for(worker.started.wait(), 60)
        reporter = asyncio.create_task(progress(store, writer, say, done))
        say(f"two workers running. 1) {live_orders:,} orders, one transaction each:")
        await writer.one_per_transaction(live_orders)
        await drained(store)
        say(f"2) a backlog of {backlog_orders:,} orders, 1,000 per transaction:")
        started = time.perf_counter()
        await writer.in_batches(backlog_orders)
        await drained(store)
        elapsed = time.perf_counter() - started
        lanes = {worker.member: sorted(worker.lanes["demo"]) for worker in workers}
    finally:
        done.set()
        if reporter is not None:
            await reporter
        stop.set()
        await asyncio.gather(*tasks)
    return elapsed, lanes


def say_lanes(writer: OrderWriter, lanes: dict[str, list[int]], say: Say) -> None:
    """The rows written per lane, four lanes a line, with each lane's owner."""
    say("rows written per lane (lane: rows, owner):")
    owners = {lane: member for member, owned in lanes.items() for lane in owned}
    cells = [
        f"{lane:>3}: {count:>5,} {owners.get(lane, '-')}"
        for lane, count in sorted(writer.per_lane.items())
    ]
    for start in range(0, len(cells), 4):
        say("  " + "   ".join(cells[start : start + 4]))
    for member, owned in lanes.items():
        say(f"  {member} sent lanes {owned}")
