"""KafkaTransport while the cluster acknowledges nothing (issue 13, items 1 and 2), with fake
producers: second copies are refused instead of piling up, a silent cluster is waited for
instead of rebuilding the producer over and over, and closing is bounded and quiet."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from relayer.transports import stalls
from relayer.transports.base import OutboundBatch, OutgoingMessage, TransportUnavailableError
from relayer.transports.kafka import KafkaTransport
from tests.unit.transports.test_kafka_producer import FakeMetadata, FakeProducer, until


class Outcomes:
    """A ``settle`` callback that records each row's outcome."""

    def __init__(self) -> None:
        self.by_index: dict[int, BaseException | None] = {}

    def __call__(self, index: int, error: BaseException | None) -> None:
        assert index not in self.by_index, f"row {index} settled twice"
        self.by_index[index] = error


def batch(ids: list[str]) -> OutboundBatch:
    return OutboundBatch(
        ids,
        [f"key-{i}" for i in range(len(ids))],
        ["orders"] * len(ids),
        [b"x"] * len(ids),
        [None] * len(ids),
    )


def transport(
    producers: list[FakeProducer], factory: Any = FakeProducer, **options: Any
) -> KafkaTransport:
    return KafkaTransport(
        "kafka",
        {"bootstrap.servers": "fake:9092"},
        producer_factory=lambda config: factory(config, producers),
        **options,
    )


def actions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [getattr(record, "action", "") for record in caplog.records]


async def test_a_second_copy_is_refused_while_the_first_waits(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stalls, "QUIET_SECONDS", 0.0)  # the stall is news at once
    producers: list[FakeProducer] = []
    kafka = transport(producers)
    await kafka.start()
    producer = producers[0]
    producer.deliver = False  # a stall: accepted, never reported
    ids = [str(uuid.uuid4()) for _ in range(3)]
    first = Outcomes()
    caplog.set_level(logging.INFO, logger="relayer.transports")
    try:
        assert await kafka.publish_batch(batch(ids), range(3), first, lambda: True) == 3
        for _ in range(2):  # the relay's next batches of the same rows
            again = Outcomes()
            assert await kafka.publish_batch(batch(ids), range(3), again, lambda: True) == 0
            assert isinstance(again.by_index[0], TransportUnavailableError)
            assert "earlier copy" in str(again.by_index[0])
        assert len(producer.queue) == 3  # no copy queued behind the first ones
        assert actions(caplog).count("transport_stall") == 1  # said once a stall
        producer.deliver = True
        await until(lambda: len(first.by_index) == 3)
        assert first.by_index == {0: None, 1: None, 2: None}
        await until(lambda: "transport_stall_over" in actions(caplog))
        third = Outcomes()
        assert await kafka.publish_batch(batch(ids), range(3), third, lambda: True) == 3
    finally:
        await kafka.close()


async def test_publish_refuses_a_second_copy_of_an_unordered_row_too() -> None:
    """``publish`` (unordered rows, after-commit dispatch) keeps no second copy of a message
    behind the first either: the recovery that sends it again during a stall is refused."""
    producers: list[FakeProducer] = []
    kafka = transport(producers)
    await kafka.start()
    producer = producers[0]
    producer.deliver = False
    message = OutgoingMessage(uuid.uuid4(), "orders", b"x", None)
    try:
        first = await kafka.publish(message)
        again = await kafka.publish(message)
        with pytest.raises(TransportUnavailableError, match="earlier copy"):
            await again
        assert len(producer.queue) == 1
        producer.deliver = True
        await asyncio.wait_for(first, 5)
        third = await kafka.publish(message)  # reported: a new copy is welcome again
        await asyncio.wait_for(third, 5)
        assert len(producer.queue) == 0
    finally:
        await kafka.close()


class SilentCluster(FakeProducer):
    """The cluster stops answering: no delivery report, and metadata requests time out."""

    silent = False

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> FakeMetadata:
        if SilentCluster.silent:
            time.sleep(min(timeout, 0.2))
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out"))
        return super().list_topics(topic, timeout)


async def test_a_silent_cluster_is_waited_for_not_rebuilt() -> None:
    producers: list[FakeProducer] = []
    kafka = transport(producers, SilentCluster, stall_timeout=0.2)
    await kafka.start()
    producer = producers[0]
    outcomes = Outcomes()
    try:
        assert await kafka.publish_batch(batch(["a", "b"]), range(2), outcomes, lambda: True)
        producer.deliver = False
        SilentCluster.silent = True
        await asyncio.sleep(1.5)  # several stall timeouts and probes
        assert len(producers) == 1  # kept: rebuilding would only drop the waiting messages
        SilentCluster.silent = False
        producer.deliver = True
        await until(lambda: len(outcomes.by_index) == 2)
        assert outcomes.by_index == {0: None, 1: None}
    finally:
        SilentCluster.silent = False
        await kafka.close()


class GaplessOnPurge(FakeProducer):
    """A stalled cluster at close: flush waits its whole timeout, and purging messages in flight
    makes poll() raise the gapless guarantee's fatal error, as librdkafka does."""

    def flush(self, timeout: float) -> int:
        time.sleep(timeout)
        return len(self.queue)

    def poll(self, timeout: float) -> int:
        if not self.deliver and not self.queue and self.fatal_reported:
            raise KafkaException(
                KafkaError(KafkaError._GAPLESS_GUARANTEE, "Purged in flight", fatal=True)
            )
        return super().poll(timeout)

    def purge(self, *args: Any, **kwargs: Any) -> None:
        super().purge(*args, **kwargs)
        self.fatal_reported = True  # the next poll raises


@pytest.fixture
def thread_errors() -> Iterator[list[BaseException | None]]:
    errors: list[BaseException | None] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)
    try:
        yield errors
    finally:
        threading.excepthook = previous


async def test_close_within_is_bounded_and_raises_nothing_in_a_thread(
    thread_errors: list[BaseException | None],
) -> None:
    producers: list[FakeProducer] = []
    kafka = transport(producers, GaplessOnPurge, close_timeout=30)
    await kafka.start()
    producers[0].deliver = False
    outcomes = Outcomes()
    acknowledgement = await kafka.publish(OutgoingMessage(uuid.uuid4(), "orders", b"x", key="k"))
    assert await kafka.publish_batch(batch(["a"]), range(1), outcomes, lambda: True) == 1
    started = time.monotonic()
    await kafka.close_within(0.3)
    assert time.monotonic() - started < 2.0  # not close_timeout (30 s)
    with pytest.raises(TransportUnavailableError):
        await acknowledgement
    await asyncio.sleep(0.1)
    assert thread_errors == []
