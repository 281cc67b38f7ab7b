"""The inbox end to end: writer-stamped sequence numbers, relayed to Kafka or RabbitMQ by a
worker, claimed from the brokers' own message objects; duplicates dropped, a gap reported."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import psycopg

from relayer import Outbox, OutboxMessage
from relayer.inbox import Inbox, Outcome, delivery_of
from relayer.settings import StoreSettings
from tests.conftest import apply_schema, make_store
from tests.contract.brokers import assign_from_the_start, create_topics, reader, unique
from tests.integration.relay.helpers import pending
from tests.integration.unordered.helpers import run_worker_until


async def relayed_store(dsn: str, transport: dict[str, Any]) -> StoreSettings:
    store = make_store(
        dsn,
        lanes=4,
        lease_duration="6s",
        poll_interval="0.1s",
        sequence_numbers=True,
        transports={"broker": transport},
        default_transport="broker",
    )
    await apply_schema(store)
    return store


def write_with_a_lost_row(store: StoreSettings, destination: str) -> None:
    """order-1 #1..#3 and order-2 #1..#2; order-1's #2 then vanishes (an operator's drop)."""
    messages = [
        OutboxMessage(destination, f"{key}#{n}".encode(), key=key)
        for n in (1, 2, 3)
        for key in ("order-1", "order-2")
        if not (key == "order-2" and n == 3)
    ]
    with psycopg.connect(store.require_dsn()) as conn:
        ids = Outbox(store).write_many(conn, messages)
        conn.execute(f"DELETE FROM {store.table_prefix}outbox WHERE id = %s", (ids[2],))
        conn.commit()


async def relay(store: StoreSettings) -> None:
    await run_worker_until(store, lambda: pending(store) == 0)


def consume_kafka_messages(bootstrap: str, topic: str, count: int) -> list[Any]:
    """``count`` confluent_kafka Message objects, as a consumer application gets them."""
    consumer = reader(bootstrap)
    try:
        assign_from_the_start(consumer, topic)
        messages: list[Any] = []
        for _ in range(60):
            messages += [m for m in consumer.consume(count, timeout=0.5) if m.error() is None]
            if len(messages) >= count:
                break
        return messages
    finally:
        consumer.close()


def claim_all(store: StoreSettings, messages: list[Any]) -> list[tuple[str, Outcome]]:
    """Each message in its own consumer transaction: (body, outcome)."""
    inbox = Inbox(store)
    outcomes: list[tuple[str, Outcome]] = []
    with psycopg.connect(store.require_dsn()) as conn:
        for message in messages:
            claim = inbox.claim_message(conn, message, "billing")
            conn.commit()
            body = message.value() if hasattr(message, "value") else message.body
            outcomes.append((body.decode(), claim.outcome))
    return outcomes


async def test_kafka_duplicates_are_dropped_and_the_gap_reported(
    pg_dsn: str, kafka_bootstrap: str
) -> None:
    topic = unique("inbox")
    await asyncio.to_thread(create_topics, kafka_bootstrap, [topic], 2)
    store = await relayed_store(pg_dsn, {"type": "kafka", "bootstrap.servers": kafka_bootstrap})
    write_with_a_lost_row(store, topic)
    await relay(store)
    delivered = await asyncio.to_thread(consume_kafka_messages, kafka_bootstrap, topic, 4)
    assert [delivery_of(m).sequence for m in delivered if m.key() == b"order-1"] == [1, 3]

    first = dict(claim_all(store, delivered))
    assert first == {
        "order-1#1": Outcome.IN_ORDER,
        "order-1#3": Outcome.GAP,
        "order-2#1": Outcome.IN_ORDER,
        "order-2#2": Outcome.IN_ORDER,
    }
    # A consumer restarted before committing its offsets reads everything again.
    again = await asyncio.to_thread(consume_kafka_messages, kafka_bootstrap, topic, 4)
    assert Counter(outcome for _, outcome in claim_all(store, again)) == {Outcome.DUPLICATE: 4}


async def test_rabbitmq_redelivery_is_a_duplicate(pg_dsn: str, rabbitmq_url: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(unique("inbox"), durable=True)
        store = await relayed_store(pg_dsn, {"type": "rabbitmq", "url": rabbitmq_url})
        write_with_a_lost_row(store, "/" + queue.name)
        await relay(store)
        received: list[Any] = []
        async with queue.iterator() as messages:
            async for message in messages:
                received.append(message)
                if len(received) == 4:
                    break
        outcomes = claim_all(store, received)
        # The consumer committed the last claim but died before its ack: redelivered.
        for message in received[:-1]:
            await message.ack()
        await received[-1].reject(requeue=True)
        redelivered = await queue.get(timeout=10)
        assert redelivered.redelivered and redelivered.message_id == received[-1].message_id
        [(_, repeat)] = claim_all(store, [redelivered])
        await redelivered.ack()
        await queue.delete()
    finally:
        await connection.close()
    assert dict(outcomes) == {
        "order-1#1": Outcome.IN_ORDER,
        "order-1#3": Outcome.GAP,
        "order-2#1": Outcome.IN_ORDER,
        "order-2#2": Outcome.IN_ORDER,
    }
    assert repeat is Outcome.DUPLICATE
