"""The contract suite runs every test against Memory, Kafka (embedded tansu) and RabbitMQ."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from relayer.transports.base import Transport
from tests.contract.brokers import Broker, KafkaBroker, MemoryBroker, RabbitMQBroker


@pytest.fixture(params=["memory", "kafka", "rabbitmq"])
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    chosen: Broker
    if request.param == "memory":
        chosen = MemoryBroker()
    elif request.param == "kafka":
        chosen = KafkaBroker(request.getfixturevalue("kafka_bootstrap"))
    else:
        chosen = RabbitMQBroker(request.getfixturevalue("rabbitmq_url"))
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
