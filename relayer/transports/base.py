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

A transport may also implement :class:`BatchPublisher` (``publish_batch``): the relay then hands
it many rows of a batch in one call, as columns, and learns each outcome through one callback
(``settle``) instead of an awaitable per message. The rules are the same; the cost per message
is a fraction. Transports without it are driven through ``publish`` one message at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from relayer.errors import TransportError

_NO_HEADERS: Mapping[str, str] = MappingProxyType({})

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


class OutboundBatch:
    """Rows of one relay batch as columns, for :class:`BatchPublisher` transports.

    Row ``index`` is the message ``ids[index]`` (the outbox id as canonical UUID text) with
    ordering key ``keys[index]`` to ``destinations[index]``, body ``bodies[index]`` and the
    application's headers ``headers[index]`` (None: no headers). ``message(index)`` builds the
    same row as an :class:`OutgoingMessage` for code that wants one.
    """

    __slots__ = ("bodies", "destinations", "headers", "ids", "keys")

    def __init__(
        self,
        ids: Sequence[str],
        keys: Sequence[str],
        destinations: Sequence[str],
        bodies: Sequence[bytes],
        headers: Sequence[Mapping[str, str] | None],
    ) -> None:
        self.ids = ids
        self.keys = keys
        self.destinations = destinations
        self.bodies = bodies
        self.headers = headers

    def __len__(self) -> int:
        return len(self.ids)

    def message(self, index: int) -> OutgoingMessage:
        headers = self.headers[index]
        return OutgoingMessage(
            UUID(self.ids[index]),
            self.destinations[index],
            self.bodies[index],
            self.keys[index],
            _NO_HEADERS if headers is None else headers,
        )


# Called once per message handed over (on the event loop's thread): the message's position in
# its OutboundBatch, and None when the broker acknowledged it, else why not (SendError,
# TransportUnavailableError, or any exception: a plug-in's bug).
Settle = Callable[[int, BaseException | None], None]


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


@runtime_checkable
class BatchPublisher(Protocol):
    """What a transport implements, besides :class:`Transport`, to be handed rows in batches."""

    async def publish_batch(
        self,
        batch: OutboundBatch,
        indexes: Sequence[int],
        settle: Settle,
        admitting: Callable[[], bool],
    ) -> int:
        """Hand the rows at ``indexes`` of ``batch`` to the client, in that order.

        Returns how many were handed over: all of them, unless the call stopped at
        ``indexes[returned]``, either because that message failed at once (too large, an unknown
        destination...: ``settle`` was already called for it) or because ``admitting()``
        returned False after the call had to wait (backpressure: the relay admits no new rows
        late in a batch); nothing after it was handed over. Every message handed over is
        settled exactly once, later or already during the call. Raises
        TransportUnavailableError when the client cannot be used now (what was handed over
        before is still settled).
        """
        ...


@runtime_checkable
class ClosesWithin(Protocol):
    """What a transport implements, besides :class:`Transport`, to close within a time its
    caller chooses: a stopping worker passes what is left of its stop budget, so that a
    stalled broker cannot hold up its exit. Without it, the worker abandons ``close()`` after
    that long."""

    async def close_within(self, seconds: float) -> None:
        """``close``, waiting at most ``seconds`` for the broker (then failing what is left as
        :class:`TransportUnavailableError`) and returning by then."""
        ...


def fail_quietly(future: asyncio.Future[None], error: BaseException) -> None:
    """Fail ``future`` with ``error``, without asyncio's "Future exception was never retrieved"
    report should its caller have dropped it.

    A caller drops an acknowledgement when it gave up on the message (a batch deadline, a
    stopping worker); the row is still in the outbox and is sent again, so the failure is no
    news. A caller that awaits the future still gets the exception.
    """
    future.set_exception(error)
    future.exception()  # marks it retrieved


class TransportFactory(Protocol):
    """What an entry point in the ``relayer.transports`` group must be."""

    def __call__(self, name: str, options: Mapping[str, Any]) -> Transport: ...
