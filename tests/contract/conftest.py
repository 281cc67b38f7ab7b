"""The contract suite runs every test against Memory, Kafka (embedded tansu), RabbitMQ and NATS
JetStream."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from relayer.transports.base import Transport
from tests.contract.brokers import (
    Broker,
    KafkaBroker,
    MemoryBroker,
    NatsBroker,
    RabbitMQBroker,
)


@pytest.fixture(params=["memory", "kafka", "rabbitmq", "nats"])
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    chosen: Broker
    if request.param == "memory":
        chosen = MemoryBroker()
    elif request.param == "kafka":
        chosen = KafkaBroker(request.getfixturevalue("kafka_bootstrap"))
    elif request.param == "rabbitmq":
        chosen = RabbitMQBroker(request.getfixturevalue("rabbitmq_url"))
    else:
        chosen = NatsBroker(request.getfixturevalue("nats_url"))
    try:
        yield chosen
    finally:
        await chosen.cleanup()


@pytest.fixture
async def transport(broker: Broker) -> AsyncIterator[Transport]:
    opened = await broker.open()
    try:
        yield opened
    finally:
        await opened.close()
