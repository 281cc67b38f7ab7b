"""The transport contract: the smallest interface the relay needs from a broker client.

The relay hands a transport one message at a time, in id order, with ``publish``. ``publish``
returns once the message has been handed to the client (it may wait for local buffer space:
that is backpressure) and gives back an awaitable that resolves when the broker acknowledged
the message, or raises :class:`SendError` when it did not. The relay decides what may be in
flight at once:

- if ``pipelines_within_key`` is true, a failure of one message fails every later message
  published to the same key and destination (Kafka's idempotent producer with the gapless
  guarantee), so the relay publishes a key's rows back to back;
- otherwise the relay pipelines across keys but waits for a key's previous acknowledgement
  before publishing its next row (stop-and-wait within a key), so a failure in the middle of a
  batch can never put a key's later row ahead of an earlier one.

Messages carry their body and headers unchanged. Transports add the outbox id and the ordering
key as the headers named below (and use the broker's native fields where it has them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from relayer.errors import TransportError

MESSAGE_ID_HEADER = "relayer-message-id"
ORDERING_KEY_HEADER = "relayer-ordering-key"
# Stamped by the writer when the store numbers each key's messages (sequence_numbers = true).
SEQUENCE_HEADER = "relayer-sequence"


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One outbox row as a transport sees it."""

    id: UUID
    destination: str
    body: bytes
    key: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    created_at: datetime | None = None

    @property
    def id_text(self) -> str:
        return str(self.id)


class SendError(TransportError):
    """The broker did not accept one message.

    ``retryable`` is False when sending the same message again cannot succeed without an
    operator's change (unknown destination, message too large, not authorized); the relay then
    parks its key with this message, which says what to fix.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class TransportUnavailableError(TransportError):
    """The broker cannot be reached right now; nothing is wrong with the messages.

    ``publish`` raises it, or an acknowledgement fails with it, when the connection is lost or
    the client is being rebuilt. The relay then keeps the rows without counting an attempt
    against their keys and tries the lane again later.
    """


class DestinationError(TransportError):
    """A destination's capabilities could not be looked up (never cached by the relay)."""


@runtime_checkable
class Transport(Protocol):
    """A broker client the relay can publish through. See the module docstring."""

    @property
    def name(self) -> str:
        """The transport's name in the store's configuration (rows refer to it)."""
        ...

    @property
    def pipelines_within_key(self) -> bool:
        """True if a failed message fails every later message of its key (gapless)."""
        ...

    async def start(self) -> None:
        """Connect. Called once before the first publish; may raise TransportError."""
        ...

    async def ordered_by_key(self, destination: str) -> bool:
        """Whether ``destination`` keeps per-key order natively (DestinationError if unknown,
        TransportUnavailableError if the broker cannot be reached to tell)."""
        ...

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        """Hand ``message`` to the client; the result resolves on the broker's acknowledgement.

        Sends are initiated in call order. The returned awaitable raises SendError on failure.
        """
        ...

    async def close(self) -> None:
        """Flush what is in flight (resolving every outstanding awaitable), then disconnect."""
        ...


class TransportFactory(Protocol):
    """What an entry point in the ``relayer.transports`` group must be."""

    def __call__(self, name: str, options: Mapping[str, Any]) -> Transport: ...
