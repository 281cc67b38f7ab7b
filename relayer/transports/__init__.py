"""Transports: how the relay hands messages to a broker.

``Transport`` is the contract (see ``relayer.transports.base``). Built-in transports are
``memory`` (fault-injectable, for tests and users), ``kafka``, ``rabbitmq``, ``nats``
(JetStream), ``redis`` (Streams), ``webhooks`` and ``sqs``; third-party transports register a
factory under the entry-point group ``relayer.transports``.
"""

import importlib
from typing import Any

from relayer.transports.base import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    SEQUENCE_HEADER,
    DestinationError,
    OutgoingMessage,
    SendError,
    Transport,
    TransportFactory,
    TransportUnavailableError,
)
from relayer.transports.memory import MemoryTransport
from relayer.transports.registry import create_transport, create_transports, known_types

_DRIVER_MODULES = {
    "KafkaTransport": "relayer.transports.kafka",
    "RabbitMQTransport": "relayer.transports.rabbitmq",
    "NatsTransport": "relayer.transports.nats",
    "RedisTransport": "relayer.transports.redis",
    "WebhookTransport": "relayer.transports.webhooks",
    "SQSTransport": "relayer.transports.sqs",
}


def __getattr__(name: str) -> Any:
    # Imported on first use, so relayer works without the brokers' extras.
    module = _DRIVER_MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "MESSAGE_ID_HEADER",
    "ORDERING_KEY_HEADER",
    "SEQUENCE_HEADER",
    "DestinationError",
    "KafkaTransport",
    "MemoryTransport",
    "NatsTransport",
    "RabbitMQTransport",
    "RedisTransport",
    "SQSTransport",
    "OutgoingMessage",
    "SendError",
    "Transport",
    "TransportFactory",
    "TransportUnavailableError",
    "WebhookTransport",
    "create_transport",
    "create_transports",
    "known_types",
]
