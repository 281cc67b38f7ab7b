"""The contract suite runs every test against Memory, Kafka (embedded tansu), RabbitMQ, NATS
JetStream, Redis Streams, a webhook receiver of the test's own and SQS (moto's server)."""

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
    RedisBroker,
    SQSBroker,
    WebhookBroker,
)


@pytest.fixture(params=["memory", "kafka", "rabbitmq", "nats", "redis", "webhooks", "sqs"])
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    chosen: Broker
    if request.param == "memory":
        chosen = MemoryBroker()
    elif request.param == "sqs":
        chosen = SQSBroker(request.getfixturevalue("sqs_endpoint"))
    elif request.param == "webhooks":
        chosen = WebhookBroker()
    elif request.param == "kafka":
        chosen = KafkaBroker(request.getfixturevalue("kafka_bootstrap"))
    elif request.param == "rabbitmq":
        chosen = RabbitMQBroker(request.getfixturevalue("rabbitmq_url"))
    elif request.param == "nats":
        chosen = NatsBroker(request.getfixturevalue("nats_url"))
    else:
        chosen = RedisBroker(request.getfixturevalue("redis_url"))
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
