"""Minimal reproductions of bugs the chaos suite found, kept as regression tests (they run in
``make test``). docs/chaos.md tells the story of each."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable

import pytest
from confluent_kafka import KafkaError, KafkaException

from relayer.transports.base import OutgoingMessage, TransportUnavailableError
from relayer.transports.kafka import KafkaTransport
from tests.unit.transports.test_kafka_producer import FakeProducer


class RaisingProducer(FakeProducer):
    """confluent-kafka raises a fatal error from ``poll()`` (seen after a broker restart:
    UNKNOWN_PRODUCER_ID, "unable to retry without risking duplication/reordering")."""

    raised = False

    def poll(self, timeout: float) -> int:
        if self.queue and not RaisingProducer.raised:
            RaisingProducer.raised = True
            raise KafkaException(KafkaError(KafkaError._FATAL, "unknown producer id", fatal=True))
        return super().poll(timeout)


async def test_a_fatal_error_raised_by_poll_rebuilds_the_producer() -> None:
    producers: list[FakeProducer] = []
    transport = KafkaTransport(
        "kafka",
        {"bootstrap.servers": "fake:9092"},
        producer_factory=lambda config: RaisingProducer(config, producers),
    )
    await transport.start()
    try:
        first = await transport.publish(OutgoingMessage(uuid.uuid4(), "orders", b"1", key="a"))
        with pytest.raises(TransportUnavailableError):
            await asyncio.wait_for(first, 3)  # failed as "will be sent again", not lost
        # The rebuild runs on the event loop just after the failure: until it has, a publish
        # is refused as unavailable (the relay holds the lane and tries again).
        again = await _publish_once_rebuilt(transport, b"2")
        await asyncio.wait_for(again, 3)  # a rebuilt producer delivers
        assert len(producers) == 2
    finally:
        await asyncio.wait_for(transport.close(), 10)


async def _publish_once_rebuilt(transport: KafkaTransport, body: bytes) -> Awaitable[None]:
    message = OutgoingMessage(uuid.uuid4(), "orders", body, key="a")
    for _ in range(300):
        try:
            return await transport.publish(message)
        except TransportUnavailableError:
            await asyncio.sleep(0.01)
    raise AssertionError("the producer was not rebuilt within 3 s")


class SilentProducer(FakeProducer):
    """A producer that accepts messages but never reports a delivery (stuck bumping epochs)."""

    def poll(self, timeout: float) -> int:
        threading.Event().wait(min(timeout, 0.005))
        return 0


async def test_a_producer_without_delivery_reports_is_rebuilt() -> None:
    producers: list[FakeProducer] = []
    transport = KafkaTransport(
        "kafka",
        {"bootstrap.servers": "fake:9092"},
        stall_timeout=0.3,
        producer_factory=lambda config: (
            SilentProducer(config, producers) if not producers else FakeProducer(config, producers)
        ),
    )
    await transport.start()
    try:
        stuck = await transport.publish(OutgoingMessage(uuid.uuid4(), "orders", b"1", key="a"))
        with pytest.raises(TransportUnavailableError):  # "will be sent again", not lost
            await asyncio.wait_for(stuck, 5)
        again = await _publish_once_rebuilt(transport, b"2")
        await asyncio.wait_for(again, 3)
        assert len(producers) == 2
    finally:
        await asyncio.wait_for(transport.close(), 10)
