"""The broker side of a chaos run: a dedicated Kafka-protocol broker, a RabbitMQ queue, a
JetStream stream, a Redis stream, a webhook receiver or an SQS queue, an optional fault proxy
in front of it, and reading back everything it got."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from relayer.embedded import EmbeddedKafka
from tests.chaos.proxy import LoopThread, Proxy, kafka_client_id
from tests.contract.brokers import (
    SQS_CREDENTIALS,
    SQS_REGION,
    Received,
    consume_kafka,
    consume_nats,
    consume_rabbitmq,
    consume_sqs,
    create_queue,
    create_topics,
    read_stream,
    unique,
)
from tests.services import unavailable

WORKER_CLIENT_ID = "relayer-chaos-worker"
PARTITIONS = 8


def start_kafka_behind_proxy(loop: LoopThread) -> tuple[Proxy, EmbeddedKafka, int]:
    """A tansu broker of its own behind a fault proxy that it advertises, so that every
    connection a client makes (metadata told it where) goes through the proxy: (proxy,
    broker, the proxy's port). The caller closes the proxy and stops the broker."""
    proxy = loop.call(lambda: Proxy(("127.0.0.1", 0), protocol="kafka"))
    port = loop.run(proxy.listen())
    broker = EmbeddedKafka(advertised_port=port).start()
    proxy.upstream = ("127.0.0.1", broker.port)
    return proxy, broker, port


@contextlib.contextmanager
def kafka_topic_behind_proxy(
    loop: LoopThread, prefix: str, partitions: int
) -> Iterator[tuple[Proxy, EmbeddedKafka, str, str]]:
    """``start_kafka_behind_proxy`` with a new topic of ``partitions`` on it: (proxy, broker,
    bootstrap through the proxy, topic); the proxy is closed and the broker stopped after."""
    proxy, broker, port = start_kafka_behind_proxy(loop)
    try:
        bootstrap = f"127.0.0.1:{port}"
        topic = unique(prefix)
        create_topics(bootstrap, [topic], partitions=partitions)
        yield proxy, broker, bootstrap, topic
    finally:
        loop.run(proxy.close())
        broker.stop()


class KafkaTarget:
    """A tansu broker of this run's own, always behind a proxy that it advertises, so that
    the relay workers' connections can be cut, slowed, stalled or refused."""

    name = "kafka"
    rereadable = True  # a topic is read from its start each time

    def __init__(self, loop: LoopThread) -> None:
        self.loop = loop
        self.proxy, self.broker, self.proxy_port = start_kafka_behind_proxy(loop)
        self.destination = unique("chaos")
        create_topics(self.bootstrap, [self.destination], partitions=PARTITIONS)
        self.earlier: list[Received] = []  # what a restarted broker held before it lost it
        self.read_errors: list[str] = []  # the consumer's error events of every read
        # The transport's close_timeout (None: the transport's default).
        self.close_timeout: float | None = 5.0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy_port}"

    def transport_toml(self) -> str:
        close = "" if self.close_timeout is None else f"close_timeout = {self.close_timeout}\n"
        return (
            f'type = "kafka"\n"bootstrap.servers" = "{self.bootstrap}"\n'
            f'"client.id" = "{WORKER_CLIENT_ID}"\n{close}'
        )

    def read_all(self) -> list[Received]:
        stored = self._stored()
        # Generous idling: on a loaded machine a short read would count as lost rows. Past the
        # watermarks too: they can lag behind what the broker acknowledged.
        received = consume_kafka(
            self.bootstrap,
            self.destination,
            stored,
            idle_seconds=15,
            beyond=2.0,
            errors=self.read_errors,
        )
        assert len(received) >= stored, f"read {len(received)} of the {stored} stored messages"
        return self.earlier + received

    def broker_errors(self) -> list[str]:
        """The error lines the broker printed since it last started."""
        return [line for line in self.broker.output().splitlines() if "ERROR" in line]

    def _stored(self) -> int:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": unique("marks")})
        try:
            return sum(
                consumer.get_watermark_offsets(TopicPartition(self.destination, number), 10)[1]
                for number in range(PARTITIONS)
            )
        finally:
            consumer.close()

    def restart(self) -> None:
        """Kill the broker and start it again, empty (its storage is in memory).

        What it acknowledged would be lost with it, which is the broker's failure, not the
        relay's. So the workers are cut off first (the proxy refuses their client id), the
        topic is read to its end, and only then is the broker killed, restarted, given its
        topic again and opened to the workers. They see their connections reset, refused
        while the broker is down, then a broker that knows nothing of their producer."""
        refused = self.loop.call(
            lambda: self.proxy.block(lambda hello: kafka_client_id(hello) == WORKER_CLIENT_ID)
        )
        assert refused >= 0
        self.earlier += consume_kafka(
            self.bootstrap,
            self.destination,
            self._stored(),
            beyond=2.0,
            errors=self.read_errors,
        )
        self.broker.restart()
        self.loop.call(lambda: setattr(self.proxy, "upstream", ("127.0.0.1", self.broker.port)))
        create_topics(self.bootstrap, [self.destination], partitions=PARTITIONS)
        self.loop.call(self.proxy.unblock)

    def close(self) -> None:
        self.loop.run(self.proxy.close())
        self.broker.stop()


def rabbitmqctl(*arguments: str) -> subprocess.CompletedProcess[str]:
    program = shutil.which("rabbitmqctl")
    if program is None:
        unavailable(
            "rabbitmqctl is not on PATH: the RabbitMQ chaos scenarios need it to make a vhost "
            "and close its connections"
        )
    assert program is not None
    result = subprocess.run(
        [program, *arguments], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        unavailable(f"rabbitmqctl {' '.join(arguments)} failed: {result.stderr.strip()}")
    return result


class RabbitTarget:
    """A durable queue in a vhost of this run's own (so closing its connections touches no
    other test), optionally behind a fault proxy."""

    name = "rabbitmq"
    rereadable = False  # reading empties the queue

    def __init__(self, loop: LoopThread, url: str, *, proxied: bool) -> None:
        self.loop = loop
        self.vhost = unique("vhost")
        rabbitmqctl("add_vhost", self.vhost)
        parts = urlsplit(url)
        user = parts.username or "guest"
        rabbitmqctl("set_permissions", "-p", self.vhost, user, ".*", ".*", ".*")
        self.url = urlunsplit(parts._replace(path="/" + quote(self.vhost, safe="")))
        self.proxy: Proxy | None = None
        worker_url = self.url
        if proxied:
            host, port = parts.hostname or "127.0.0.1", parts.port or 5672
            self.proxy = loop.call(lambda: Proxy((host, port)))
            proxy_port = loop.run(self.proxy.listen())
            credentials = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
            worker_url = urlunsplit(
                urlsplit(self.url)._replace(netloc=f"{credentials}127.0.0.1:{proxy_port}")
            )
        self.worker_url = worker_url
        self.queue = unique("chaos")
        self.destination = "/" + self.queue
        self.loop.run(self._declare())

    async def _declare(self) -> None:
        import aio_pika

        connection = await aio_pika.connect(self.url)
        try:
            channel = await connection.channel()
            await channel.declare_queue(self.queue, durable=True)
        finally:
            await connection.close()

    def transport_toml(self) -> str:
        return f'type = "rabbitmq"\nurl = "{self.worker_url}"\nreconnect_interval = 0.2\n'

    def close_connections(self) -> str:
        """``rabbitmqctl close_all_connections`` for this run's vhost."""
        return rabbitmqctl("close_all_connections", "--vhost", self.vhost, "chaos").stdout

    def read_all(self) -> list[Received]:
        return self.loop.run(self._read_all(), timeout=300)

    async def _read_all(self) -> list[Received]:
        import aio_pika

        connection = await aio_pika.connect(self.url)
        try:
            channel = await connection.channel()
            queue: Any = await channel.declare_queue(self.queue, passive=True)
            count = queue.declaration_result.message_count
            await channel.close()
            return await consume_rabbitmq(connection, self.queue, count)
        finally:
            await connection.close()

    def close(self) -> None:
        if self.proxy is not None:
            self.loop.run(self.proxy.close())
        subprocess.run(
            ["rabbitmqctl", "delete_vhost", self.vhost], capture_output=True, check=False
        )


class NatsTarget:
    """A JetStream stream of this run's own, its subject reached through a fault proxy."""

    name = "nats"
    rereadable = True  # a stream is read from its start each time

    def __init__(self, loop: LoopThread, url: str) -> None:
        self.loop = loop
        self.url = url
        parts = urlsplit(url)
        upstream = (parts.hostname or "127.0.0.1", parts.port or 4222)
        self.proxy = loop.call(lambda: Proxy(upstream, protocol="nats"))
        self.proxy_port = loop.run(self.proxy.listen())
        self.stream = unique("chaos")
        self.destination = self.stream.replace("-", "_") + ".events"
        self.loop.run(self._stream(add=True))

    async def _stream(self, *, add: bool) -> None:
        import nats

        connection = await nats.connect(self.url)
        try:
            if add:
                await connection.jetstream().add_stream(
                    name=self.stream, subjects=[self.destination]
                )
            else:
                await connection.jetstream().delete_stream(self.stream)
        finally:
            await connection.close()

    def transport_toml(self) -> str:
        return (
            f'type = "nats"\nurl = "nats://127.0.0.1:{self.proxy_port}"\n'
            "reconnect_interval = 0.2\nclose_timeout = 5\n"
        )

    def read_all(self) -> list[Received]:
        return self.loop.run(self._read_all(), timeout=300)

    async def _read_all(self) -> list[Received]:
        import nats

        connection = await nats.connect(self.url)
        try:
            info = await connection.jetstream().stream_info(self.stream)
            return await consume_nats(connection, self.destination, info.state.messages)
        finally:
            await connection.close()

    def close(self) -> None:
        self.loop.run(self.proxy.close())
        with contextlib.suppress(Exception):
            self.loop.run(self._stream(add=False))


class RedisTarget:
    """A stream of this run's own on the Redis server, reached through a fault proxy."""

    name = "redis"
    rereadable = True  # a stream is read from its start each time

    def __init__(self, loop: LoopThread, url: str) -> None:
        self.loop = loop
        self.url = url
        parts = urlsplit(url)
        upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.proxy = loop.call(lambda: Proxy(upstream))
        self.proxy_port = loop.run(self.proxy.listen())
        self.destination = unique("chaos")

    def transport_toml(self) -> str:
        worker_url = urlunsplit(urlsplit(self.url)._replace(netloc=f"127.0.0.1:{self.proxy_port}"))
        return f'type = "redis"\nurl = "{worker_url}"\nsocket_timeout = 5\nclose_timeout = 5\n'

    def read_all(self) -> list[Received]:
        return self.loop.run(self._with_client(read_stream), timeout=300)

    async def _with_client(self, action: Any) -> Any:
        import redis.asyncio

        client: Any = redis.asyncio.Redis.from_url(self.url)
        try:
            return await action(client, self.destination)
        finally:
            await client.aclose()

    def close(self) -> None:
        self.loop.run(self.proxy.close())

        async def delete(client: Any, stream: str) -> None:
            await client.delete(stream)

        with contextlib.suppress(Exception):
            self.loop.run(self._with_client(delete))


class WebhookTarget:
    """A webhook receiver of this run's own (tests/webhook_receiver.py) behind a fault proxy:
    the workers post through the proxy, the receiver keeps every delivery in order."""

    name = "webhooks"
    rereadable = True  # the receiver keeps what it got

    def __init__(self, loop: LoopThread) -> None:
        from tests.webhook_receiver import Receiver

        self.loop = loop
        self.receiver = Receiver().start()
        self.proxy = loop.call(lambda: Proxy(("127.0.0.1", self.receiver.port)))
        self.proxy_port = loop.run(self.proxy.listen())
        self.destination = unique("chaos")

    def transport_toml(self) -> str:
        return (
            f'type = "webhooks"\nurl = "http://127.0.0.1:{self.proxy_port}"\n'
            f'secret = "{self.receiver.secret}"\ntimeout = 1.5\nclose_timeout = 5\n'
        )

    def read_all(self) -> list[Received]:
        assert all(request.signed for request in self.receiver.delivered)
        return self.receiver.received("/" + self.destination)

    def close(self) -> None:
        self.loop.run(self.proxy.close())
        self.receiver.stop()


class SQSTarget:
    """A FIFO queue of this run's own on moto's SQS server, behind a fault proxy the workers
    send through."""

    name = "sqs"
    rereadable = False  # reading empties the queue

    def __init__(self, loop: LoopThread, endpoint: str) -> None:
        self.loop = loop
        self.endpoint = endpoint
        parts = urlsplit(endpoint)
        upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.proxy = loop.call(lambda: Proxy(upstream))
        self.proxy_port = loop.run(self.proxy.listen())
        self.destination = unique("chaos") + ".fifo"
        loop.run(create_queue(endpoint, self.destination))

    def transport_toml(self) -> str:
        return (
            f'type = "sqs"\nregion = "{SQS_REGION}"\n'
            f'endpoint_url = "http://127.0.0.1:{self.proxy_port}"\n'
            f'access_key_id = "{SQS_CREDENTIALS["access_key_id"]}"\n'
            f'secret_access_key = "{SQS_CREDENTIALS["secret_access_key"]}"\n'
            "timeout = 1.5\nclose_timeout = 5\n"
        )

    def read_all(self) -> list[Received]:
        return self.loop.run(consume_sqs(self.endpoint, self.destination, 10**9), timeout=600)

    def close(self) -> None:
        self.loop.run(self.proxy.close())
