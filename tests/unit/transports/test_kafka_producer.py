"""KafkaTransport's poll thread, backpressure and fatal-error rebuild, with a fake producer."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from relayer.transports.base import OutgoingMessage, SendError, TransportUnavailableError
from relayer.transports.kafka import KafkaTransport


class FakeTopic:
    def __init__(self) -> None:
        self.error = None
        self.partitions = {0: None}


class FakeMetadata:
    def __init__(self, topic: str | None) -> None:
        self.topics = {} if topic in (None, "missing") else {topic: FakeTopic()}


class FakeProducer:
    """Queues produced messages; ``poll`` delivers them when the test allows it, each report a
    confluent_kafka Message at the next offset of partition 0 of its topic (or, while
    ``offsets`` holds any, at the offsets it lists: None for none)."""

    def __init__(self, config: dict[str, Any], registry: list[FakeProducer]) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.queue: list[tuple[bytes, Callable[[Any, Any], None]]] = []
        self.topics: list[str] = []  # each queued message's topic
        self.logs: dict[str, int] = {}  # topic -> its partition's next offset
        self.offsets: list[int | None] = []
        self.deliver = True
        self.capacity = 1_000_000
        self.fatal: KafkaError | None = None
        self.fatal_reported = False
        self.crash: BaseException | None = None
        registry.append(self)

    def __len__(self) -> int:
        return len(self.queue)

    def produce(self, topic: str, value: bytes, key: bytes | None, **kwargs: Any) -> None:
        with self.lock:
            if self.fatal is not None:
                raise KafkaException(KafkaError(KafkaError._FATAL, "fatal", fatal=True))
            if len(self.queue) >= self.capacity:
                raise BufferError("Local: Queue full")
            self.queue.append((value, kwargs["on_delivery"]))
            self.topics.append(topic)

    def poll(self, timeout: float) -> int:
        if self.crash is not None:
            crash, self.crash = self.crash, None
            raise crash
        with self.lock:
            if self.fatal is not None and not self.fatal_reported:
                self.fatal_reported = True
                self.config["error_cb"](self.fatal)
                return 1
            ready = self.queue if self.deliver else []
            topics = self.topics if self.deliver else []
            if self.deliver:
                self.queue, self.topics = [], []
        for (_, callback), topic in zip(ready, topics, strict=True):
            callback(None, self.report(topic))
        if not ready:
            threading.Event().wait(min(timeout, 0.005))
        return len(ready)

    def report(self, topic: str) -> Message:
        """The next successful delivery report of ``topic`` (its log grows by one)."""
        offset = self.logs.get(topic, 0)
        self.logs[topic] = offset + 1
        if self.offsets:
            reported = self.offsets.pop(0)
            offset = -1 if reported is None else reported
        return Message(topic=topic, partition=0, offset=offset, value=b"")

    def flush(self, timeout: float) -> int:
        self.deliver = True
        self.poll(0)
        return 0

    def purge(self, *args: Any, **kwargs: Any) -> None:
        with self.lock:
            purged, self.queue, self.topics = self.queue, [], []
        for _, callback in purged:
            callback(KafkaError(KafkaError._PURGE_QUEUE), None)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> FakeMetadata:
        return FakeMetadata(topic)


def fake_transport(
    producers: list[FakeProducer], fail_calls: frozenset[int] = frozenset()
) -> KafkaTransport:
    """A transport whose producers are fakes; the factory raises on the calls numbered in
    ``fail_calls`` (0 is the first)."""
    calls = 0

    def factory(config: dict[str, Any]) -> FakeProducer:
        nonlocal calls
        calls += 1
        if calls - 1 in fail_calls:
            raise OSError("ssl.ca.location: no such file")
        return FakeProducer(config, producers)

    return KafkaTransport(
        "kafka",
        {"bootstrap.servers": "fake:9092", "sasl.password": "hunter2"},
        producer_factory=factory,
    )


@contextlib.asynccontextmanager
async def started_fake() -> AsyncIterator[tuple[KafkaTransport, list[FakeProducer]]]:
    """A started transport of fake producers (``fake_transport``), closed after."""
    producers: list[FakeProducer] = []
    transport = fake_transport(producers)
    await transport.start()
    try:
        yield transport, producers
    finally:
        await transport.close()


@pytest.fixture
async def kafka() -> AsyncIterator[tuple[KafkaTransport, list[FakeProducer]]]:
    async with started_fake() as started:
        yield started


async def until(condition: Callable[[], bool], seconds: float = 10) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


def message(key: str = "a", topic: str = "orders") -> OutgoingMessage:
    return OutgoingMessage(uuid.uuid4(), topic, b"body", key=key)


async def settle(awaitable: Any) -> BaseException | None:
    try:
        await asyncio.wait_for(awaitable, 10)
    except Exception as exc:
        return exc
    return None


async def test_deliveries_resolve_from_the_poll_thread(kafka: Any) -> None:
    transport, _ = kafka
    acknowledgements = [await transport.publish(message(str(n))) for n in range(100)]
    assert [await settle(a) for a in acknowledgements] == [None] * 100


async def test_repr_and_config_never_show_secrets(kafka: Any) -> None:
    transport, producers = kafka
    assert "hunter2" not in repr(transport)
    assert producers[0].config["sasl.password"] == "hunter2"  # passed through to librdkafka
    assert producers[0].config["enable.gapless.guarantee"] is True


async def test_a_missing_topic_fails_without_producing(kafka: Any) -> None:
    transport, producers = kafka
    error = await settle(await transport.publish(message(topic="missing")))
    assert isinstance(error, SendError) and not error.retryable
    assert producers[0].queue == []


async def full_queue(
    transport: KafkaTransport, producer: FakeProducer
) -> tuple[list[Any], asyncio.Future[Any]]:
    """Two messages held in a queue of two, and a third publish waiting for room."""
    producer.deliver = False
    producer.capacity = 2
    held = [await transport.publish(message()) for _ in range(2)]
    waiting = asyncio.ensure_future(transport.publish(message()))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # publish waits for space instead of failing
    return held, waiting


async def test_a_full_local_queue_is_backpressure(kafka: Any) -> None:
    transport, producers = kafka
    producer = producers[0]
    first, blocked = await full_queue(transport, producer)
    producer.deliver = True
    third = await asyncio.wait_for(blocked, 10)
    assert [await settle(a) for a in [*first, third]] == [None] * 3


async def test_a_fatal_error_fails_outstanding_as_unavailable_and_rebuilds(kafka: Any) -> None:
    transport, producers = kafka
    old = producers[0]
    old.deliver = False
    outstanding = [await transport.publish(message()) for _ in range(3)]
    with old.lock:
        old.fatal = KafkaError(KafkaError._FATAL, "idempotence broke", fatal=True)
    errors = [await settle(a) for a in outstanding]
    assert all(isinstance(error, TransportUnavailableError) for error in errors)
    assert "fatal error" in str(errors[0])
    # Rebuilt: the next publish goes to a new producer and succeeds.
    for _ in range(100):
        if len(producers) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(producers) == 2
    assert await settle(await transport.publish(message())) is None


async def test_close_flushes_everything(kafka: Any) -> None:
    transport, producers = kafka
    producers[0].deliver = False
    acknowledgements = [await transport.publish(message()) for _ in range(5)]
    await transport.close()
    assert all(a.done() and a.exception() is None for a in acknowledgements)


async def test_a_rebuild_while_a_publish_waits_for_space_fails_that_publish(kafka: Any) -> None:
    """The waiting message's key lost its earlier messages with the old producer: it must not
    go to the new producer ahead of their resend (the broker would get them out of order)."""
    transport, producers = kafka
    old = producers[0]
    earlier, waiting = await full_queue(transport, old)
    with old.lock:
        old.fatal = KafkaError(KafkaError._FATAL, "idempotence broke", fatal=True)
    errors = [await settle(a) for a in [*earlier, waiting]]
    assert all(isinstance(error, TransportUnavailableError) for error in errors), errors
    await until(lambda: len(producers) == 2)
    assert producers[1].queue == []  # nothing of that key reached the new producer


async def test_a_failed_rebuild_is_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    producers: list[FakeProducer] = []
    transport = fake_transport(producers, fail_calls=frozenset({1}))
    await transport.start()
    try:
        old = producers[0]
        old.deliver = False
        outstanding = await transport.publish(message())
        with old.lock:
            old.fatal = KafkaError(KafkaError._FATAL, "idempotence broke", fatal=True)
        assert isinstance(await settle(outstanding), TransportUnavailableError)
        with pytest.raises(TransportUnavailableError):  # the dead producer is still current
            await (await transport.publish(message()))
        await until(lambda: len(producers) == 2)  # the second attempt, a second later
        assert "could not rebuild its producer" in caplog.text
        assert await settle(await transport.publish(message())) is None
    finally:
        await transport.close()


async def test_a_message_larger_than_the_local_queue_fails_alone(kafka: Any) -> None:
    transport, producers = kafka
    producers[0].capacity = 0  # refused though nothing is queued: it can never fit
    error = await settle(await transport.publish(message()))
    assert isinstance(error, SendError) and not error.retryable
    assert "queue.buffering.max.kbytes" in str(error)


async def test_an_unexpected_error_in_poll_rebuilds_instead_of_stopping_the_thread(
    kafka: Any,
) -> None:
    transport, producers = kafka
    old = producers[0]
    old.deliver = False
    outstanding = await transport.publish(message())
    old.crash = RuntimeError("a bug in a callback")
    assert isinstance(await settle(outstanding), TransportUnavailableError)
    await until(lambda: len(producers) == 2)
    assert await settle(await transport.publish(message())) is None
