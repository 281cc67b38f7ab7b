"""Minimal reproductions of bugs the chaos suite found (xfail, strict: a fix turns them into
failures that ask for the marker to go). docs/chaos.md tells the story of each."""

from __future__ import annotations

import asyncio
import uuid

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


@pytest.mark.chaos
@pytest.mark.xfail(
    strict=True,
    reason="bug: a KafkaException raised by producer.poll() ends the transport's poll thread; "
    "acknowledgements never resolve and the producer is never rebuilt (the worker's lanes stall)",
)
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
        again = await transport.publish(OutgoingMessage(uuid.uuid4(), "orders", b"2", key="a"))
        await asyncio.wait_for(again, 3)  # a rebuilt producer delivers
    finally:
        await asyncio.wait_for(transport.close(), 10)
