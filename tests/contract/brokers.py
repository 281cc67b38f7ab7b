"""One adapter per transport for the contract suite: fresh destinations, a real consumer, and
the transport's own way to make one message of a batch fail."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from relayer.transports.base import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    OutgoingMessage,
    Transport,
)
from relayer.transports.memory import MemoryTransport


@dataclass(frozen=True, slots=True)
class Received:
    """A message as a consumer saw it."""

    body: bytes
    headers: Mapping[str, str]
    key: str | None
    partition: int | None = None  # where a Kafka consumer read it
    offset: int | None = None

    @property
    def message_id(self) -> str:
        return self.headers[MESSAGE_ID_HEADER]


def unique(prefix: str) -> str:
    return f"relayer-test-{prefix}-{uuid.uuid4().hex[:10]}"


class Broker:
    """What the contract tests need from each broker."""

    name = "?"
    # Whether a destination that does not exist is refused by ordered_by_key.
    transport: Transport
    # Seconds the 1,000-key test may take to publish (a webhook is one request a message).
    deadline = 30.0

    async def open(self) -> Transport:
        raise NotImplementedError

    async def destination(self) -> str:
        raise NotImplementedError

    def bad_destination(self) -> str:
        raise NotImplementedError

    def failing(self, message: OutgoingMessage) -> OutgoingMessage:
        """``message`` changed so that this broker refuses it, same key and order position."""
        raise NotImplementedError

    async def consume(self, destination: str, count: int) -> list[Received]:
        raise NotImplementedError

    async def cleanup(self) -> None:
        """Remove what the test created."""


class MemoryBroker(Broker):
    name = "memory"

    def __init__(self) -> None:
        self.memory = MemoryTransport("memory")

    async def open(self) -> Transport:
        await self.memory.start()
        self.memory.declare_unknown("missing")
        return self.memory

    async def destination(self) -> str:
        return unique("memory")

    def bad_destination(self) -> str:
        return "missing"

    def failing(self, message: OutgoingMessage) -> OutgoingMessage:
        self.memory.fail_message(message.id, retryable=False, message="injected failure")
        # Held acknowledgements let later messages of the key be in flight when it fails.
        self.memory.stall()
        asyncio.get_running_loop().call_soon(self.memory.resume)
        return message

    async def consume(self, destination: str, count: int) -> list[Received]:
        return [
            Received(message.body, _headers_of(message), message.key)
            for message in self.memory.received(destination)
        ]


def _headers_of(message: OutgoingMessage) -> dict[str, str]:
    headers = dict(message.headers)
    headers[MESSAGE_ID_HEADER] = message.id_text
    if message.key is not None:
        headers[ORDERING_KEY_HEADER] = message.key
    return headers


class KafkaBroker(Broker):
    name = "kafka"

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.topics: list[str] = []

    async def open(self) -> Transport:
        from relayer.transports.kafka import KafkaTransport

        transport = KafkaTransport(
            "kafka",
            # A short propagation time: an unknown topic fails in 1 s, not librdkafka's 30 s.
            {"bootstrap.servers": self.bootstrap, "topic.metadata.propagation.max.ms": 1000},
        )
        await transport.start()
        return transport

    async def destination(self) -> str:
        topic = unique("topic")
        await asyncio.to_thread(create_topics, self.bootstrap, [topic])
        self.topics.append(topic)
        return topic

    def bad_destination(self) -> str:
        return unique("missing-topic")

    def failing(self, message: OutgoingMessage) -> OutgoingMessage:
        # Over the producer's message.max.bytes: refused by librdkafka, like a broker would.
        return dataclasses.replace(message, body=b"x" * 1_100_000)

    async def consume(self, destination: str, count: int) -> list[Received]:
        return await asyncio.to_thread(consume_kafka, self.bootstrap, destination, count)

    async def cleanup(self) -> None:
        if self.topics:
            await asyncio.to_thread(delete_topics, self.bootstrap, self.topics)


def create_topics(bootstrap: str, topics: Sequence[str], partitions: int = 4) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(topic, partitions, 1) for topic in topics])
    for future in created.values():
        future.result(30)


def delete_topics(bootstrap: str, topics: Sequence[str]) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(list(topics)).values():
        # Cleanup only: tansu's in-memory topics vanish with the broker anyway.
        with contextlib.suppress(Exception):
            future.result(30)


def reader(bootstrap: str) -> Any:
    """A Kafka consumer of its own group that commits nothing (``assign_from_the_start``)."""
    from confluent_kafka import Consumer

    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("group"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )


def assign_from_the_start(consumer: Any, topic: str) -> None:
    """Read every partition of ``topic`` from offset 0, not from OFFSET_BEGINNING: tansu
    answers the EARLIEST offset with the batch written first, not the lowest offset, so a read
    from OFFSET_BEGINNING starts past a large batch whose write ended after that of a later,
    smaller one (docs/chaos.md). On a Kafka log that starts above 0, the consumer's
    ``auto.offset.reset`` (earliest) takes the read to its start."""
    from confluent_kafka import TopicPartition

    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, number, 0) for number in partitions])


def consume_kafka(
    bootstrap: str,
    topic: str,
    count: int,
    idle_seconds: float = 5.0,
    beyond: float = 0.0,
    errors: list[str] | None = None,
) -> list[Received]:
    """Everything in ``topic`` (at least ``count`` messages, or what came before going idle).

    ``beyond``: once ``count`` messages were read, go on until nothing came for that long. The
    tansu broker's watermark offsets (the usual source of ``count``) can lag behind what it
    acknowledged and serves by seconds, so a read that stops at them misses the newest.
    ``errors``: where to put the consumer's error events (a message it could not read, say),
    which are skipped otherwise."""
    consumer = reader(bootstrap)
    try:
        assign_from_the_start(consumer, topic)
        received: list[Received] = []
        idle = 0.0
        while idle < (idle_seconds if len(received) < count else beyond):
            batch = consumer.consume(1000, timeout=0.5)
            idle = idle + 0.5 if not batch else 0.0
            for record in batch:
                if record.error() is not None:
                    if errors is not None:
                        errors.append(
                            f"partition {record.partition()} offset {record.offset()}: "
                            f"{record.error()}"
                        )
                    continue
                headers = {name: (value or b"").decode() for name, value in record.headers() or []}
                key = record.key()
                received.append(
                    Received(
                        record.value() or b"",
                        headers,
                        None if key is None else key.decode(),
                        record.partition(),
                        record.offset(),
                    )
                )
        return received
    finally:
        consumer.close()


class RabbitMQBroker(Broker):
    name = "rabbitmq"

    def __init__(self, url: str) -> None:
        self.url = url
        self.queues: list[str] = []
        self.connection: Any = None

    async def open(self) -> Transport:
        import aio_pika

        from relayer.transports.rabbitmq import RabbitMQTransport

        self.connection = await aio_pika.connect(self.url)
        transport = RabbitMQTransport("rabbitmq", self.url)
        await transport.start()
        return transport

    async def destination(self) -> str:
        channel = await self.connection.channel()
        queue = await channel.declare_queue(unique("queue"), durable=True)
        self.queues.append(queue.name)
        await channel.close()
        return "/" + queue.name

    def bad_destination(self) -> str:
        return unique("missing-exchange") + "/anything"

    def failing(self, message: OutgoingMessage) -> OutgoingMessage:
        # amq.direct exists, but nothing is bound for this routing key: returned, unroutable.
        return dataclasses.replace(message, destination="amq.direct/" + unique("unbound"))

    async def consume(self, destination: str, count: int) -> list[Received]:
        return await consume_rabbitmq(self.connection, destination.removeprefix("/"), count)

    async def cleanup(self) -> None:
        if self.connection is None:
            return
        channel = await self.connection.channel()
        for name in self.queues:
            await channel.queue_delete(name)
        await self.connection.close()


async def consume_rabbitmq(
    connection: Any, queue_name: str, count: int, idle_seconds: float = 5.0
) -> list[Received]:
    """Consume ``queue_name`` until ``count`` messages arrived or it stayed idle for a while."""
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=1000)
    queue = await channel.get_queue(queue_name, ensure=True)
    received: list[Received] = []
    arrived = asyncio.Event()

    async def on_message(message: Any) -> None:
        headers = {
            name: value.decode() if isinstance(value, bytes) else str(value)
            for name, value in (message.headers or {}).items()
        }
        received.append(Received(message.body, headers, headers.get(ORDERING_KEY_HEADER)))
        await message.ack()
        if len(received) >= count:
            arrived.set()

    tag = await queue.consume(on_message)
    try:
        while len(received) < count:
            seen = len(received)
            try:
                await asyncio.wait_for(arrived.wait(), idle_seconds)
            except TimeoutError:
                if len(received) == seen:
                    break
        return received
    finally:
        await queue.cancel(tag)
        await channel.close()


class NatsBroker(Broker):
    """A JetStream stream of its own per destination. Its max_msg_size lets the server refuse
    one message of a batch (``failing``) while the others of the batch are in flight."""

    name = "nats"
    MAX_MESSAGE = 100_000

    def __init__(self, url: str) -> None:
        self.url = url
        self.streams: list[str] = []
        self.connection: Any = None

    async def open(self) -> Transport:
        import nats

        from relayer.transports.nats import NatsTransport

        self.connection = await nats.connect(self.url)
        transport = NatsTransport("nats", self.url)
        await transport.start()
        return transport

    async def destination(self) -> str:
        stream = unique("stream")
        subject = stream.replace("-", "_") + ".events"
        await self.connection.jetstream().add_stream(
            name=stream, subjects=[subject], max_msg_size=self.MAX_MESSAGE
        )
        self.streams.append(stream)
        return subject

    def bad_destination(self) -> str:
        return unique("missing-subject")

    def failing(self, message: OutgoingMessage) -> OutgoingMessage:
        # Over the stream's max_msg_size (not the server's max_payload): JetStream refuses it.
        return dataclasses.replace(message, body=b"x" * (self.MAX_MESSAGE * 2))

    async def consume(self, destination: str, count: int) -> list[Received]:
        return await consume_nats(self.connection, destination, count)

    async def cleanup(self) -> None:
        if self.connection is None:
            return
        jetstream = self.connection.jetstream()
        for stream in self.streams:
            with contextlib.suppress(Exception):
                await jetstream.delete_stream(stream)
        await self.connection.close()


async def consume_nats(
    connection: Any, subject: str, count: int, idle_seconds: float = 5.0
) -> list[Received]:
    """Everything stored for ``subject`` from its stream's start, in stream order (at least
    ``count`` messages, or what came before going idle)."""
    import nats.errors

    subscription = await connection.jetstream().subscribe(subject, ordered_consumer=True)
    received: list[Received] = []
    try:
        while True:
            try:
                message = await subscription.next_msg(
                    timeout=idle_seconds if len(received) < count else 0.5
                )
            except nats.errors.TimeoutError:
                break
            headers = dict(message.headers or {})
            received.append(Received(message.data, headers, headers.get(ORDERING_KEY_HEADER)))
        return received
    finally:
        await subscription.unsubscribe()


class RedisBroker(Broker):
    """A stream of its own per destination; a key of another type is the bad destination
    (WRONGTYPE) and the failing message's."""

    name = "redis"

    def __init__(self, url: str) -> None:
        self.url = url
        self.keys: list[str] = []
        self.client: Any = None
        self.wrong_type = unique("wrongtype")

    async def open(self) -> Transport:
        import redis.asyncio

        from relayer.transports.redis import RedisTransport

        self.client = redis.asyncio.Redis.from_url(self.url)
        await self.client.set(self.wrong_type, "not a stream")
        self.keys.append(self.wrong_type)
        transport = RedisTransport("redis", self.url)
        await transport.start()
        return transport

    async def destination(self) -> str:
        stream = unique("stream")
        self.keys.append(stream)
        return stream

    def bad_destination(self) -> str:
        return self.wrong_type

    def failing(self, message: OutgoingMessage) -> OutgoingMessage:
        return dataclasses.replace(message, destination=self.wrong_type)

    async def consume(self, destination: str, count: int) -> list[Received]:
        return await read_stream(self.client, destination)

    async def cleanup(self) -> None:
        if self.client is None:
            return
        await self.client.delete(*self.keys)
        await self.client.aclose()


async def read_stream(client: Any, stream: str) -> list[Received]:
    """Every entry of ``stream``, in stream order, as a consumer of the documented fields
    sees it (relayer.transports.redis)."""
    from relayer.transports.redis.transport import BODY_FIELD, HEADER_FIELD_PREFIX

    received: list[Received] = []
    start = "-"
    while True:
        entries = await client.xrange(stream, min=start, count=10_000)
        for _, fields in entries:
            decoded = {name.decode(): value for name, value in fields.items()}
            headers = {
                name.removeprefix(HEADER_FIELD_PREFIX): value.decode()
                for name, value in decoded.items()
                if name.startswith(HEADER_FIELD_PREFIX)
            }
            for name in (MESSAGE_ID_HEADER, ORDERING_KEY_HEADER):
                if name in decoded:
                    headers[name] = decoded[name].decode()
            received.append(
                Received(decoded[BODY_FIELD], headers, headers.get(ORDERING_KEY_HEADER))
            )
        if len(entries) < 10_000:
            return received
        start = "(" + entries[-1][0].decode()


class WebhookBroker(Broker):
    """A receiver of the test's own (tests/webhook_receiver.py); destinations are paths."""

    name = "webhooks"
    deadline = 120.0

    def __init__(self) -> None:
        from tests.webhook_receiver import Receiver

        self.receiver = Receiver().start()

    async def open(self) -> Transport:
        from relayer.transports.webhooks import WebhookTransport

        transport = WebhookTransport("webhooks", self.receiver.url, self.receiver.secret)
        await transport.start()
        return transport

    async def destination(self) -> str:
        return unique("hooks")

    def bad_destination(self) -> str:
        return unique("missing") + "/../elsewhere"  # would leave the url: refused

    def failing(self, message: OutgoingMessage) -> OutgoingMessage:
        return dataclasses.replace(message, headers={"x-test-status": "422"})

    async def consume(self, destination: str, count: int) -> list[Received]:
        received = await asyncio.to_thread(self.receiver.wait_for, count, "/" + destination)
        assert all(request.signed for request in self.receiver.delivered)
        return received

    async def cleanup(self) -> None:
        self.receiver.stop()


SQS_CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing"}
SQS_REGION = "us-east-1"


def sqs_client(endpoint: str) -> Any:
    """An aiobotocore SQS client context for ``endpoint`` (moto: dummy credentials)."""
    from aiobotocore.session import get_session

    return get_session().create_client(
        "sqs",
        region_name=SQS_REGION,
        endpoint_url=endpoint,
        aws_access_key_id=SQS_CREDENTIALS["access_key_id"],
        aws_secret_access_key=SQS_CREDENTIALS["secret_access_key"],
    )


async def create_queue(endpoint: str, name: str, **attributes: str) -> str:
    fifo = {"FifoQueue": "true"} if name.endswith(".fifo") else {}
    async with sqs_client(endpoint) as client:
        answer = await client.create_queue(QueueName=name, Attributes={**fifo, **attributes})
    return str(answer["QueueUrl"])


async def consume_sqs(
    endpoint: str, queue: str, count: int, idle_seconds: float = 5.0
) -> list[Received]:
    """Receive (and delete) from ``queue`` until ``count`` messages came or it stayed empty for
    ``idle_seconds``; bodies and headers decoded as docs/sqs.md tells consumers to."""
    import base64
    import json
    import time

    received: list[Received] = []
    async with sqs_client(endpoint) as client:
        url = (await client.get_queue_url(QueueName=queue))["QueueUrl"]
        idle_since = time.monotonic()
        while len(received) < count and time.monotonic() - idle_since < idle_seconds:
            answer = await client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                MessageAttributeNames=["All"],
                VisibilityTimeout=600,
            )
            messages = answer.get("Messages") or []
            if not messages:
                await asyncio.sleep(0.1)
                continue
            idle_since = time.monotonic()
            for message in messages:
                attributes = {
                    name: value["StringValue"]
                    for name, value in (message.get("MessageAttributes") or {}).items()
                }
                encoding = attributes.pop("relayer-body-encoding", None)
                text = message["Body"]
                body = (
                    b""
                    if encoding == "empty"
                    else base64.b64decode(text)
                    if encoding == "base64"
                    else text.encode()
                )
                headers = json.loads(attributes.pop("relayer-headers", "{}"))
                headers.update(attributes)
                received.append(Received(body, headers, headers.get(ORDERING_KEY_HEADER)))
            await client.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(number), "ReceiptHandle": message["ReceiptHandle"]}
                    for number, message in enumerate(messages)
                ],
            )
    return received


class SQSBroker(Broker):
    """moto's SQS server; destinations are FIFO queues of the test's own."""

    name = "sqs"
    deadline = 120.0

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def open(self) -> Transport:
        from relayer.transports.sqs import SQSTransport

        # moto answers slowly on a busy machine: a generous timeout, so that the test never
        # depends on how fast it is (the relay would send again, but not within the test).
        transport = SQSTransport(
            "sqs", SQS_REGION, endpoint_url=self.endpoint, credentials=SQS_CREDENTIALS, timeout=120
        )
        await transport.start()
        return transport

    async def destination(self) -> str:
        name = unique("queue") + ".fifo"
        await create_queue(self.endpoint, name)
        return name

    def bad_destination(self) -> str:
        return unique("missing") + ".fifo"

    def failing(self, message: OutgoingMessage) -> OutgoingMessage:
        # Over the queue's MaximumMessageSize (1 MiB): refused before it is sent.
        return dataclasses.replace(message, body=b"x" * 1_100_000)

    async def consume(self, destination: str, count: int) -> list[Received]:
        return await consume_sqs(self.endpoint, destination, count)
