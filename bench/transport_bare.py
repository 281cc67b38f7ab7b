"""Bare producers against relayer's transports: messages per second, from memory.

    python bench/transport_bare.py [--count 100000] [--keys 10000] [--only kafka|rabbitmq]

Kafka: confluent-kafka producing ``count`` 200-byte messages over ``keys`` keys with the same
settings as KafkaTransport, then KafkaTransport driven the way the relay drives it
(the relay's own send pipeline, relayer.testing.pipeline, over batches of several lanes at
once). RabbitMQ: an aio-pika publisher with confirms and a window of outstanding publishes,
then RabbitMQTransport through the same pipeline (stop-and-wait within a key). Kafka is the
embedded tansu broker unless ``--kafka-bootstrap`` (or RELAYER_BENCH_KAFKA_BOOTSTRAP) names
one; RabbitMQ is ``--rabbitmq-url`` (default: the loopback server). Prints figures; asserts
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from relayer.testing.pipeline import relay_messages
from relayer.transports.base import OutgoingMessage, Transport

BODY = b"x" * 200


def messages(count: int, keys: int, destination: str) -> list[OutgoingMessage]:
    return [
        OutgoingMessage(uuid.uuid4(), destination, BODY, key=f"key-{index % keys}")
        for index in range(count)
    ]


def rate(label: str, count: int, seconds: float) -> float:
    per_second = count / seconds
    print(f"{label:<34} {count:>9,} msgs {seconds:8.2f} s {per_second:>12,.0f} msg/s", flush=True)
    return per_second


async def through_transport(
    transport: Transport,
    batch: Sequence[OutgoingMessage],
    *,
    lanes: int = 8,
    batch_size: int = 500,
) -> float:
    """Seconds to publish ``batch`` relay-style: ``lanes`` concurrent batches of ``batch_size``.

    Messages are split among lanes by key, as the relay's lanes split them.
    """
    per_lane: list[list[OutgoingMessage]] = [[] for _ in range(lanes)]
    for message in batch:
        per_lane[hash(message.key) % lanes].append(message)

    async def lane(rows: list[OutgoingMessage]) -> None:
        for start in range(0, len(rows), batch_size):
            outcomes = await relay_messages(transport, rows[start : start + batch_size])
            failed = [sent for sent in outcomes if sent.outcome != "acked"]
            if failed:
                raise RuntimeError(f"{len(failed)} messages failed, first: {failed[0]}")

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for rows in per_lane:
            group.create_task(lane(rows))
    return time.perf_counter() - started


# -- Kafka ---------------------------------------------------------------------------------


@contextmanager
def kafka_cluster(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from relayer.embedded import EmbeddedKafka

    with EmbeddedKafka() as broker:
        yield broker.bootstrap_servers


def create_topic(bootstrap: str, partitions: int = 8) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"bench-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    return topic


def kafka_producer(bootstrap: str, topic: str) -> Any:
    """A confluent-kafka producer with KafkaTransport's settings, past its first delivery."""
    from confluent_kafka import Producer

    from relayer.transports.kafka.rules import check_config

    producer = Producer(check_config({"bootstrap.servers": bootstrap}, None))
    producer.produce(topic, b"warm-up", b"warm-up")
    producer.flush(30)  # the first delivery waits ~0.5 s for the idempotent producer id
    return producer


def produce_all(producer: Any, topic: str, batch: Sequence[OutgoingMessage]) -> None:
    """Produce ``batch`` and wait until the broker acknowledged every message."""
    delivered = 0

    def on_delivery(error: object, _message: object) -> None:
        nonlocal delivered
        if error is None:
            delivered += 1

    for message in batch:
        headers = [("relayer-message-id", message.id_text)]
        while True:
            try:
                producer.produce(
                    topic, message.body, (message.key or "").encode(), headers=headers,
                    on_delivery=on_delivery,
                )  # fmt: skip
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)
    assert delivered == len(batch), f"only {delivered} of {len(batch)} delivered"


def bare_kafka(bootstrap: str, topic: str, batch: Sequence[OutgoingMessage]) -> float:
    producer = kafka_producer(bootstrap, topic)
    started = time.perf_counter()
    produce_all(producer, topic, batch)
    return time.perf_counter() - started


async def kafka_transport(bootstrap: str, topic: str, batch: Sequence[OutgoingMessage]) -> float:
    from relayer.transports.kafka import KafkaTransport

    transport = KafkaTransport("bench", {"bootstrap.servers": bootstrap})
    await transport.start()
    try:
        await relay_messages(transport, messages(1, 1, topic))  # the ~0.5 s producer id
        return await through_transport(transport, batch)
    finally:
        await transport.close()


# -- RabbitMQ ------------------------------------------------------------------------------


async def bare_rabbitmq(url: str, queue: str, batch: Sequence[OutgoingMessage]) -> float:
    import aio_pika

    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        started = time.perf_counter()
        await publish_all(channel.default_exchange, queue, batch)
        return time.perf_counter() - started
    finally:
        await connection.close()


async def publish_all(exchange: Any, queue: str, batch: Sequence[OutgoingMessage]) -> None:
    """Publish ``batch`` with up to 1,000 confirms outstanding; return when all are confirmed."""
    import aio_pika

    window: list[Awaitable[object]] = []
    for message in batch:
        outgoing = aio_pika.Message(
            message.body,
            message_id=message.id_text,
            headers={"relayer-message-id": message.id_text},
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        window.append(asyncio.ensure_future(exchange.publish(outgoing, queue)))
        if len(window) >= 1_000:
            await asyncio.gather(*window)
            window.clear()
    await asyncio.gather(*window)


async def rabbitmq_transport(url: str, queue: str, batch: Sequence[OutgoingMessage]) -> float:
    from relayer.transports.rabbitmq import RabbitMQTransport

    transport = RabbitMQTransport("bench", url)
    await transport.start()
    try:
        return await through_transport(transport, batch)
    finally:
        await transport.close()


async def with_queue(url: str, run: Callable[[str], Awaitable[float]]) -> float:
    import aio_pika

    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(f"bench-{uuid.uuid4().hex[:12]}", durable=True)
        try:
            return await run(queue.name)
        finally:
            await queue.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--only", choices=("kafka", "rabbitmq"))
    parser.add_argument(
        "--kafka-bootstrap", default=os.environ.get("RELAYER_BENCH_KAFKA_BOOTSTRAP")
    )
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    args = parser.parse_args()
    if args.only in (None, "kafka"):
        with kafka_cluster(args.kafka_bootstrap) as bootstrap:
            topic = create_topic(bootstrap)
            batch = messages(args.count, args.keys, topic)
            bare = rate(
                "Kafka bare confluent-kafka", args.count, bare_kafka(bootstrap, topic, batch)
            )
            batch = messages(args.count, args.keys, topic)
            seconds = asyncio.run(kafka_transport(bootstrap, topic, batch))
            ours = rate("KafkaTransport (relay-style)", args.count, seconds)
            print(f"{'KafkaTransport / bare':<34} {ours / bare:>45.2f}x")
    if args.only in (None, "rabbitmq"):
        count = args.count // 5  # RabbitMQ confirms are far slower than Kafka batches
        url = args.rabbitmq_url

        async def bare_run(queue: str) -> float:
            return await bare_rabbitmq(url, queue, messages(count, args.keys, ""))

        async def transport_run(queue: str) -> float:
            return await rabbitmq_transport(url, queue, messages(count, args.keys, "/" + queue))

        bare = rate(
            "RabbitMQ bare aio-pika pipelined", count, asyncio.run(with_queue(url, bare_run))
        )
        seconds = asyncio.run(with_queue(url, transport_run))
        ours = rate("RabbitMQTransport (relay-style)", count, seconds)
        print(f"{'RabbitMQTransport / bare':<34} {ours / bare:>45.2f}x")


if __name__ == "__main__":
    main()
