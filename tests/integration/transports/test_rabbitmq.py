"""RabbitMQ specifics on the real broker: reconnects, ordered destinations, consistent hashing."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
import subprocess
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import aiormq
import pytest

from relayer.errors import TransportError
from relayer.testing.pipeline import relay_messages
from relayer.transports.base import OutgoingMessage, SendError, TransportUnavailableError
from relayer.transports.rabbitmq import RabbitMQTransport, frames
from tests.contract.brokers import consume_rabbitmq, unique
from tests.services import unavailable


class Proxy:
    """A TCP relay to the broker that the test can cut, like a network failure."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self.flowing = asyncio.Event()  # cleared: the broker side stops reading the client
        self.flowing.set()
        self.connect_delay = 0.0

    async def start(self) -> Proxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(self.connect_delay)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self.writers += [writer, up_writer]

        async def pump(
            source: asyncio.StreamReader, sink: asyncio.StreamWriter, gate: asyncio.Event | None
        ) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while True:
                    if gate is not None:
                        await gate.wait()
                    data = await source.read(65536)
                    if not data:
                        break
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pump(reader, up_writer, self.flowing), pump(up_reader, writer, None))

    def cut(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()

    async def stop(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


async def proxy_to(url: str) -> Proxy:
    """A started proxy to the broker of ``url``; connect through it with ``via``."""
    parts = urlsplit(url)
    return await Proxy(parts.hostname or "127.0.0.1", parts.port or 5672).start()


def via(url: str, port: int) -> str:
    parts = urlsplit(url)
    credentials = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{credentials}127.0.0.1:{port}"))


@pytest.fixture
async def channel(rabbitmq_url: str) -> AsyncIterator[Any]:
    connection = await aio_pika.connect(rabbitmq_url)
    yield await connection.channel()
    await connection.close()


async def cleanup(transport: RabbitMQTransport, queue: Any, proxy: Proxy | None = None) -> None:
    """A test's end: close the transport, stop the proxy, delete the queue."""
    await transport.close()
    if proxy is not None:
        await proxy.stop()
    await queue.delete(if_unused=False, if_empty=False)


async def fresh_queue(channel: Any, **arguments: Any) -> Any:
    return await channel.declare_queue(unique("queue"), durable=True, arguments=arguments or None)


async def test_a_lost_connection_fails_outstanding_confirms_and_reconnects(
    rabbitmq_url: str, channel: Any
) -> None:
    proxy = await proxy_to(rabbitmq_url)
    queue = await fresh_queue(channel)
    transport = RabbitMQTransport("flaky", via(rabbitmq_url, proxy.port), reconnect_interval=0.01)
    try:
        await transport.start()
        destination = "/" + queue.name
        acknowledgements = [
            asyncio.ensure_future(
                await transport.publish(OutgoingMessage(uuid.uuid4(), destination, b"x", key="k"))
            )
            for _ in range(200)
        ]
        proxy.cut()
        await asyncio.wait(acknowledgements)
        errors = [a.exception() for a in acknowledgements]
        assert all(e is None or isinstance(e, TransportUnavailableError) for e in errors)
        assert any(isinstance(e, TransportUnavailableError) for e in errors)
        # The next publish reconnects through the proxy.
        again = OutgoingMessage(uuid.uuid4(), destination, b"again", key="k")
        await asyncio.wait_for(await transport.publish(again), 30)
    finally:
        await cleanup(transport, queue, proxy)


async def test_confirms_abandoned_by_their_caller_are_never_reported(
    rabbitmq_url: str, channel: Any
) -> None:
    """The broker stops answering, the caller gives up on its acknowledgements (a batch
    deadline), then the connection drops: every message fails, and asyncio must not log one
    "Future exception was never retrieved" per message (nor for the lost socket write)."""
    reports: list[str] = []
    asyncio.get_running_loop().set_exception_handler(
        lambda loop, context: reports.append(context["message"])
    )
    proxy = await proxy_to(rabbitmq_url)
    queue = await fresh_queue(channel)
    transport = RabbitMQTransport("stalled", via(rabbitmq_url, proxy.port))
    try:
        await transport.start()
        proxy.flowing.clear()  # nothing reaches the broker: no confirm comes back
        for _ in range(200):
            await transport.publish(OutgoingMessage(uuid.uuid4(), "/" + queue.name, b"x" * 1000))
        proxy.cut()
        for _ in range(200):
            if not transport._outstanding:
                break
            await asyncio.sleep(0.01)
        assert not transport._outstanding  # every confirm failed
        gc.collect()
        await asyncio.sleep(0.05)
        assert reports == []
    finally:
        await cleanup(transport, queue, proxy)


async def test_publishes_of_one_turn_arrive_whole_in_order_with_large_and_empty_bodies(
    rabbitmq_url: str, channel: Any
) -> None:
    """The publishes of one event-loop turn go out together (in writes of about 1 MiB);
    bodies larger than the negotiated frame_max are split into several body frames, an empty
    body has none. Everything arrives whole, in publish order."""
    queue = await fresh_queue(channel)
    transport = RabbitMQTransport("batched", rabbitmq_url)
    try:
        await transport.start()
        frame_max = (await transport._link.ensure_channel(force=False)).max_content_size
        bodies = [b"", b"small", bytes(range(256)) * (frame_max // 256 * 2 + 3), b"x" * frame_max]
        bodies.append(b"z" * (3 << 19))  # 1.5 MiB: the turn's publishes take several writes
        bodies += [f"row-{index}".encode() for index in range(500)]
        messages = [
            OutgoingMessage(uuid.uuid4(), "/" + queue.name, body, key=f"k{index % 7}",
                            headers={"n": str(index)})
            for index, body in enumerate(bodies)
        ]  # fmt: skip
        # No await between the publishes' returns: all are written in one turn.
        acknowledgements = [await transport.publish(message) for message in messages]
        await asyncio.wait_for(asyncio.gather(*acknowledgements), 30)
        connection = await aio_pika.connect(rabbitmq_url)
        try:
            received = await consume_rabbitmq(connection, queue.name, len(messages))
        finally:
            await connection.close()
        assert [r.body for r in received] == bodies
        assert [r.headers["n"] for r in received] == [str(i) for i in range(len(bodies))]
        assert [r.headers["relayer-message-id"] for r in received] == [m.id_text for m in messages]
    finally:
        await cleanup(transport, queue)


async def test_a_message_amqp_cannot_encode_fails_alone(rabbitmq_url: str, channel: Any) -> None:
    """A header value with no UTF-8 form fails that message, not retryable; the messages
    published in the same turn around it are confirmed."""
    queue = await fresh_queue(channel)
    transport = RabbitMQTransport("encode", rabbitmq_url)
    try:
        await transport.start()
        destination = "/" + queue.name
        before, after = (OutgoingMessage(uuid.uuid4(), destination, b"ok", key="k") for _ in "ab")
        bad = OutgoingMessage(uuid.uuid4(), destination, b"x", key="k", headers={"h": "\udc80"})
        acknowledgements = [await transport.publish(m) for m in (before, bad, after)]
        results = await asyncio.gather(*acknowledgements, return_exceptions=True)
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], SendError) and not results[1].retryable
        assert "cannot encode" in str(results[1])
    finally:
        await cleanup(transport, queue)


async def test_a_second_copy_of_an_unconfirmed_message_waits_for_the_first(
    rabbitmq_url: str, channel: Any
) -> None:
    """RabbitMQ returns an unroutable message by its id: while one copy is unconfirmed, a
    second copy with the same id is not written (a return could be taken for either), so a
    returned message is never reported as sent."""
    queue = await fresh_queue(channel)
    transport = RabbitMQTransport("copies", rabbitmq_url)
    try:
        await transport.start()
        message_id = uuid.uuid4()
        to_nowhere = OutgoingMessage(message_id, f"/missing-{uuid.uuid4().hex}", b"lost?")
        to_queue = OutgoingMessage(message_id, "/" + queue.name, b"again")
        first = await transport.publish(to_nowhere)
        second = await transport.publish(to_queue)
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert isinstance(results[0], SendError) and not results[0].retryable
        assert "unroutable" in str(results[0])
        # Waiting for the broker's confirm is not the row's fault: no attempt is counted.
        assert isinstance(results[1], TransportUnavailableError)
        assert "earlier copy" in str(results[1])
        # Once the first copy settled, the id can be sent again.
        await asyncio.wait_for(await transport.publish(to_queue), 30)
        assert (await queue.declare()).message_count == 1
    finally:
        await cleanup(transport, queue)


async def test_a_broker_that_stops_reading_makes_publish_wait(
    rabbitmq_url: str, channel: Any
) -> None:
    """Backpressure: with the connection's socket buffer full, publish waits instead of
    buffering every outstanding message in memory; everything goes once the broker reads."""
    proxy = await proxy_to(rabbitmq_url)
    queue = await fresh_queue(channel)
    transport = RabbitMQTransport("slow", via(rabbitmq_url, proxy.port), max_outstanding=2_000)
    acknowledgements: list[Any] = []
    try:
        await transport.start()
        proxy.flowing.clear()

        async def publish_all() -> None:
            for _ in range(2_000):
                message = OutgoingMessage(uuid.uuid4(), "/" + queue.name, b"x" * 100_000)
                acknowledgements.append(await transport.publish(message))

        publishing = asyncio.ensure_future(publish_all())
        await asyncio.sleep(2)
        assert not publishing.done()
        assert len(acknowledgements) < 200  # about 20 MB of 200 MB, not all of it
        proxy.flowing.set()
        await asyncio.wait_for(publishing, 60)
        await asyncio.wait_for(asyncio.gather(*acknowledgements), 60)
    finally:
        await cleanup(transport, queue, proxy)


async def test_a_publish_cancelled_while_waiting_for_the_broker_leaves_the_others_waiting(
    rabbitmq_url: str, channel: Any
) -> None:
    """Publishes held back by backpressure share one wait; cancelling one of them (its batch's
    deadline) must not cancel the others."""
    proxy = await proxy_to(rabbitmq_url)
    queue = await fresh_queue(channel)
    transport = RabbitMQTransport("shared-wait", via(rabbitmq_url, proxy.port))
    try:
        await transport.start()
        proxy.flowing.clear()
        destination = "/" + queue.name
        early: list[Any] = []

        async def publish(body: bytes) -> Any:
            return await transport.publish(OutgoingMessage(uuid.uuid4(), destination, body))

        async def fill() -> None:  # until the socket buffers are full and publish waits
            for _ in range(2_000):
                early.append(await publish(b"x" * 100_000))

        filling = asyncio.ensure_future(fill())
        while True:
            published = len(early)
            await asyncio.sleep(0.5)
            if len(early) == published:
                break
        cancelled = asyncio.ensure_future(publish(b"cancelled"))
        waiting = asyncio.ensure_future(publish(b"waiting"))
        await asyncio.sleep(0.5)
        assert not cancelled.done() and not waiting.done()
        cancelled.cancel()
        await asyncio.sleep(0.1)
        assert not waiting.done()
        proxy.flowing.set()
        acknowledgement = await asyncio.wait_for(waiting, 30)
        await asyncio.wait_for(filling, 60)
        await asyncio.wait_for(asyncio.gather(acknowledgement, *early), 60)
    finally:
        await cleanup(transport, queue, proxy)


async def test_close_during_a_reconnect_sends_nothing_and_leaves_no_connection(
    rabbitmq_url: str, channel: Any
) -> None:
    proxy = await proxy_to(rabbitmq_url)
    queue = await fresh_queue(channel)
    transport = RabbitMQTransport("closing", via(rabbitmq_url, proxy.port), reconnect_interval=0)
    try:
        await transport.start()
        proxy.cut()
        await asyncio.sleep(0.3)
        proxy.connect_delay = 0.5  # the next connect is slow: close() comes in the middle

        async def publish() -> None:
            message = OutgoingMessage(uuid.uuid4(), "/" + queue.name, b"after close")
            await (await transport.publish(message))

        publishing = asyncio.ensure_future(publish())
        await asyncio.sleep(0.1)
        await transport.close()
        [outcome] = await asyncio.gather(publishing, return_exceptions=True)
        assert isinstance(outcome, TransportError) and "closed" in str(outcome)
        assert transport._link.connection is None
        await asyncio.sleep(0.3)
        assert (await queue.declare()).message_count == 0
    finally:
        await proxy.stop()
        await queue.delete(if_unused=False, if_empty=False)


async def test_an_untested_aiormq_publishes_through_basic_publish(
    rabbitmq_url: str,
    channel: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The fast path uses aiormq's channel internals; with an aiormq it was not tested with,
    the transport starts all the same, says once that it takes the public (slower) path, and
    delivers every message, in order, with the same outcomes."""
    monkeypatch.setattr(frames, "installed_aiormq", lambda: "7.9.0")
    queue = await fresh_queue(channel)
    transport = RabbitMQTransport("new-client", rabbitmq_url)
    try:
        with caplog.at_level(logging.WARNING, logger="relayer.transports.rabbitmq"):
            await transport.start()
        assert transport._link.encoder is None
        slow = [record for record in caplog.records if "basic_publish" in record.getMessage()]
        assert len(slow) == 1 and "7.9.0" in slow[0].getMessage()
        destination = "/" + queue.name
        sent = [
            OutgoingMessage(uuid.uuid4(), destination, f"{n}".encode(), key="k") for n in range(50)
        ]
        acknowledgements = [await transport.publish(message) for message in sent]
        await asyncio.wait_for(asyncio.gather(*acknowledgements), 30)
        nowhere = await transport.publish(
            OutgoingMessage(uuid.uuid4(), f"/missing-{uuid.uuid4().hex}", b"lost?")
        )
        with pytest.raises(SendError, match="unroutable"):
            await asyncio.wait_for(nowhere, 30)
        connection = await aio_pika.connect(rabbitmq_url)
        try:
            received = await consume_rabbitmq(connection, queue.name, 50)
        finally:
            await connection.close()
        assert [message.body for message in received] == [message.body for message in sent]
    finally:
        await transport.close()
        await queue.delete(if_unused=False, if_empty=False)


def test_the_fast_path_names_what_a_channel_lacks() -> None:
    class OldChannel:
        delivery_tag = 0
        confirmations: ClassVar[dict[int, Any]] = {}
        connection = type("Connection", (), {"channels": {}})()

    problem = frames.fast_path_problem(OldChannel())
    assert problem is not None and "message_id_delivery_tag" in problem


async def test_nothing_is_written_on_a_channel_the_broker_closed(
    rabbitmq_url: str, channel: Any
) -> None:
    """When the broker closes the channel, aiormq forgets its number at once and marks it
    closed a few turns later; publishes in between are not written (that would be a protocol
    error closing the whole connection) but fail as unavailable, to be sent again."""
    queue = await fresh_queue(channel)
    transport = RabbitMQTransport("closing-channel", rabbitmq_url)
    try:
        await transport.start()
        underlay = transport._link.underlay
        connection = underlay.connection
        forgotten = connection.channels.pop(underlay.number)  # as on the broker's Channel.Close
        tag = underlay.delivery_tag
        acknowledgement = await transport.publish(
            OutgoingMessage(uuid.uuid4(), "/" + queue.name, b"not now")
        )
        with pytest.raises(TransportUnavailableError):
            await asyncio.wait_for(acknowledgement, 10)
        assert underlay.delivery_tag == tag  # nothing numbered, nothing written
        connection.channels[underlay.number] = forgotten
        again = OutgoingMessage(uuid.uuid4(), "/" + queue.name, b"now")
        await asyncio.wait_for(await transport.publish(again), 30)
        assert (await queue.declare()).message_count == 1
    finally:
        await cleanup(transport, queue)


async def test_frames_wait_in_order_when_the_connection_writer_queue_is_full() -> None:
    """aiormq's writer queue is small; frames beyond it are handed over by one task, in order,
    and frames written meanwhile queue behind them."""

    class Underlay:
        write_queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)

    transport = RabbitMQTransport("queued", "amqp://guest:guest@127.0.0.1:5672/")
    underlay = Underlay()
    transport._writer.frames.extend(["a", "b", "c"])  # type: ignore[list-item]
    transport._writer.write_frames(underlay)
    transport._writer.frames.append("d")  # type: ignore[arg-type]
    transport._writer.write_frames(underlay)  # the pump owns writing: "d" must not jump ahead
    seen = [await asyncio.wait_for(underlay.write_queue.get(), 5) for _ in range(4)]
    assert seen == ["a", "b", "c", "d"]
    await asyncio.sleep(0)
    assert transport._writer.pump is None and not transport._writer.frames
    # Frames still waiting when the connection goes are dropped with it (their confirmations
    # fail as the channel closes): none may reach the next connection's queue.
    transport._writer.frames.extend(["e", "f", "g"])  # type: ignore[list-item]
    transport._writer.write_frames(underlay)
    assert transport._writer.pump is not None
    await transport._link.disconnect()
    assert transport._writer.pump is None and not transport._writer.frames


async def test_an_unreachable_broker_is_a_clear_unavailable_error(rabbitmq_url: str) -> None:
    proxy = await Proxy("127.0.0.1", 1).start()  # nothing listens upstream
    url = via(rabbitmq_url.replace("guest:guest", "guest:hunter2"), proxy.port)
    transport = RabbitMQTransport("down", url, connect_timeout=2)
    try:
        with pytest.raises(TransportError) as caught:
            await transport.start()
        assert "hunter2" not in str(caught.value)
        assert "cannot connect" in str(caught.value)
    finally:
        await transport.close()
        await proxy.stop()


async def test_exchanges_are_ordered_only_when_listed(rabbitmq_url: str) -> None:
    plain = RabbitMQTransport("plain", rabbitmq_url)
    listed = RabbitMQTransport("listed", rabbitmq_url, ordered_destinations=["amq.direct"])
    for transport in (plain, listed):
        await transport.start()
    try:
        assert await plain.ordered_by_key("amq.direct/anything") is False
        assert await listed.ordered_by_key("amq.direct/anything") is True
    finally:
        await plain.close()
        await listed.close()


async def declare_hash_exchange(url: str, name: str) -> bool:
    """Declare an x-consistent-hash exchange; False if the broker lacks the plugin."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        await channel.declare_exchange(name, "x-consistent-hash", durable=False)
    except (aiormq.exceptions.AMQPError, aio_pika.exceptions.AMQPException):
        return False
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
    return True


@pytest.fixture
async def hash_exchange(rabbitmq_url: str) -> AsyncIterator[str]:
    """A fresh x-consistent-hash exchange, enabling the plugin on a local broker if needed."""
    name = unique("hash")
    if not await declare_hash_exchange(rabbitmq_url, name):
        plugins = shutil.which("rabbitmq-plugins")
        if plugins is None:
            unavailable(
                "RabbitMQ lacks the rabbitmq_consistent_hash_exchange plugin and "
                "rabbitmq-plugins is not on PATH to enable it; run: rabbitmq-plugins enable "
                "rabbitmq_consistent_hash_exchange"
            )
        enabled = await asyncio.to_thread(
            subprocess.run,
            [plugins, "enable", "rabbitmq_consistent_hash_exchange"],
            capture_output=True,
            text=True,
            check=False,
        )
        if enabled.returncode != 0 or not await declare_hash_exchange(rabbitmq_url, name):
            unavailable(
                "could not enable the rabbitmq_consistent_hash_exchange plugin: "
                f"{enabled.stderr.strip() or enabled.stdout.strip()}"
            )
    yield name
    connection = await aio_pika.connect(rabbitmq_url)
    channel = await connection.channel()
    await channel.exchange_delete(name)
    await connection.close()


async def test_consistent_hash_with_single_active_consumer_queues_keeps_key_order(
    rabbitmq_url: str, channel: Any, hash_exchange: str
) -> None:
    exchange = await channel.get_exchange(hash_exchange)
    queues = [await fresh_queue(channel, **{"x-single-active-consumer": True}) for _ in range(3)]
    for queue in queues:
        await queue.bind(exchange, routing_key="1")  # the binding key is the queue's weight
    transport = RabbitMQTransport("hashed", rabbitmq_url, ordered_destinations=[exchange.name])
    await transport.start()
    destination = f"{exchange.name}/{{key}}"
    try:
        assert await transport.ordered_by_key(destination) is True
        keys, per_key = 300, 4
        messages = [
            OutgoingMessage(uuid.uuid4(), destination, f"k{k}#{n}".encode(), key=f"k{k}")
            for n in range(per_key)
            for k in range(keys)
        ]
        assert {sent.outcome for sent in await relay_messages(transport, messages)} == {"acked"}
        connection = await aio_pika.connect(rabbitmq_url)
        seen: dict[str, list[int]] = defaultdict(list)
        where: dict[str, set[str]] = defaultdict(set)
        total = 0
        for queue in queues:
            passive = await channel.declare_queue(queue.name, passive=True)
            count = passive.declaration_result.message_count
            for received in await consume_rabbitmq(connection, queue.name, count):
                key, number = received.body.decode().split("#")
                seen[key].append(int(number))
                where[key].add(queue.name)
                total += 1
        await connection.close()
        assert total == keys * per_key
        assert all(numbers == list(range(per_key)) for numbers in seen.values())
        assert all(len(names) == 1 for names in where.values())  # a key lives in one queue
    finally:
        await transport.close()
        for queue in queues:
            await queue.delete(if_unused=False, if_empty=False)
