"""Unordered rows on real brokers: after-commit dispatch to Kafka and RabbitMQ, and a worker
recovering what a crashed application never sent."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from relayer import Outbox, OutboxMessage
from relayer.settings import StoreSettings
from relayer.transports.base import MESSAGE_ID_HEADER
from relayer.writer.after_commit import UnorderedDispatcher
from tests.conftest import apply_schema, make_store
from tests.contract.brokers import consume_kafka, consume_rabbitmq, create_topics, unique
from tests.integration.unordered.helpers import backdate, rows, run_worker_until


async def store_for(dsn: str, transport: dict[str, Any], **overrides: Any) -> StoreSettings:
    store = make_store(
        dsn,
        lanes=4,
        lease_duration="6s",
        poll_interval="0.1s",
        transports={"broker": transport},
        default_transport="broker",
        **overrides,
    )
    await apply_schema(store)
    return store


async def write_and_dispatch(store: StoreSettings, destination: str, count: int) -> list[Any]:
    outbox = Outbox(store)
    async with (
        UnorderedDispatcher(outbox) as dispatcher,  # the store's transports, started here
        await psycopg.AsyncConnection.connect(store.require_dsn()) as conn,
    ):
        ids = await outbox.write_many_async(
            conn, [OutboxMessage(destination, f"mail {n}".encode()) for n in range(count)]
        )
        await conn.commit()
        result = await dispatcher.dispatch_after_commit(conn)
    assert (result.sent, result.error) == (count, "")
    return ids


async def test_after_commit_dispatch_to_kafka(pg_dsn: str, kafka_bootstrap: str) -> None:
    topic = unique("unordered")
    await asyncio.to_thread(create_topics, kafka_bootstrap, [topic], 2)
    store = await store_for(pg_dsn, {"type": "kafka", "bootstrap.servers": kafka_bootstrap})
    ids = await write_and_dispatch(store, topic, 5)
    received = await asyncio.to_thread(consume_kafka, kafka_bootstrap, topic, 5)
    assert sorted(message.message_id for message in received) == sorted(map(str, ids))
    assert rows(store) == {}


async def test_after_commit_dispatch_to_rabbitmq(pg_dsn: str, rabbitmq_url: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(unique("unordered"), durable=True)
        store = await store_for(pg_dsn, {"type": "rabbitmq", "url": rabbitmq_url})
        ids = await write_and_dispatch(store, "/" + queue.name, 5)
        received = await consume_rabbitmq(connection, queue.name, 5)
        await queue.delete()
    finally:
        await connection.close()
    assert sorted(message.headers[MESSAGE_ID_HEADER] for message in received) == sorted(
        map(str, ids)
    )
    assert rows(store) == {}


async def test_a_worker_recovers_a_crashed_applications_rows(
    pg_dsn: str, kafka_bootstrap: str
) -> None:
    topic = unique("recovered")
    await asyncio.to_thread(create_topics, kafka_bootstrap, [topic], 2)
    store = await store_for(
        pg_dsn,
        {"type": "kafka", "bootstrap.servers": kafka_bootstrap},
        maintenance_interval="0.1s",
    )
    outbox = Outbox(store)  # no dispatcher: the application dies right after its commits
    with psycopg.connect(store.require_dsn()) as conn:
        crashed = outbox.write_many(conn, [OutboxMessage(topic, b"lost?")] * 6)
        conn.commit()
        young = outbox.write(conn, destination=topic, body=b"still its application's")
        conn.commit()
    backdate(store, crashed, seconds=40)  # older than unordered_grace (30 s)
    worker = await run_worker_until(store, lambda: set(rows(store)) == {young}, pool_size=3)
    received = await asyncio.to_thread(consume_kafka, kafka_bootstrap, topic, 6)
    assert sorted(message.message_id for message in received) == sorted(map(str, crashed))
    assert worker.stores[store.name].maintenance.recovered == 6
