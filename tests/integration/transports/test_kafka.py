"""Kafka specifics on the embedded broker: start-up failures and topic lookups."""

from __future__ import annotations

import uuid

import pytest

from relayer.embedded import free_port
from relayer.errors import TransportError
from relayer.transports.base import DestinationError, OutgoingMessage
from relayer.transports.kafka import KafkaTransport
from tests.contract.brokers import create_topics, unique


async def test_an_unreachable_cluster_fails_start_clearly_without_secrets() -> None:
    transport = KafkaTransport(
        "events",
        {
            "bootstrap.servers": f"127.0.0.1:{free_port()}",
            "sasl.password": "hunter2",
            "log_level": 0,  # librdkafka would log every refused connection
        },
        metadata_timeout=1,
    )
    with pytest.raises(TransportError) as caught:
        await transport.start()
    assert "cannot reach the cluster" in str(caught.value)
    assert "hunter2" not in str(caught.value) and "hunter2" not in repr(transport)


async def test_topics_are_looked_up_once_and_missing_ones_explained(kafka_bootstrap: str) -> None:
    topic = unique("topic")
    create_topics(kafka_bootstrap, [topic], partitions=2)
    transport = KafkaTransport("events", {"bootstrap.servers": kafka_bootstrap})
    await transport.start()
    try:
        assert await transport.ordered_by_key(topic) is True
        with pytest.raises(DestinationError, match="does not exist; create it"):
            await transport.ordered_by_key(unique("missing"))
        message = OutgoingMessage(uuid.uuid4(), topic, b"x", key="k")
        await (await transport.publish(message))
    finally:
        await transport.close()
