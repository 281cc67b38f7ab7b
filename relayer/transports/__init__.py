"""Transports: how the relay hands messages to a broker.

``Transport`` is the contract (see ``relayer.transports.base``). Built-in transports are
``memory`` (fault-injectable, for tests and users), ``kafka`` and ``rabbitmq``; third-party
transports register a factory under the entry-point group ``relayer.transports``.
"""

from relayer.transports.base import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    DestinationError,
    OutgoingMessage,
    SendError,
    Transport,
    TransportFactory,
    TransportUnavailableError,
)

__all__ = [
    "MESSAGE_ID_HEADER",
    "ORDERING_KEY_HEADER",
    "DestinationError",
    "OutgoingMessage",
    "SendError",
    "Transport",
    "TransportFactory",
    "TransportUnavailableError",
]
