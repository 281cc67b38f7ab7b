"""Routing: which transport a store's row goes to, and what a send's error means.

One ``Routing`` per store serves its ordered relay and its unordered sending alike:

- ``transport(name)``: the transport a row names (None: the store's ``default_transport``), or
  a :class:`PreparationError` that says what to configure;
- ``publisher(transport)``: what the send pipeline hands rows to (the transport's own
  ``publish_batch``, or :class:`PerMessage` over its ``publish``);
- ``require_ordered(transport, destination)``: whether a destination keeps per-key order,
  asked of the transport once and remembered (``DestinationCache``).

``classify`` is the one reading of an error that a send, an acknowledgement or a capability
lookup raised, for every path:

- :class:`SendError`: the row's fault (``permanent`` when sending it again cannot succeed
  without an operator's change); a :class:`PreparationError` too: the row cannot be sent as
  it is;
- any other :class:`TransportError`: the broker cannot be used now; not the row's fault, no
  attempt is counted;
- a cancellation: the send was abandoned (the worker is stopping); the row stays unsent;
- anything else: a plug-in's own bug; the row's fault (its key is parked with the error, an
  unordered row is retried later), never the whole batch's.
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, cast

from relayer.errors import RelayerError, TransportError
from relayer.transports.base import (
    BatchPublisher,
    OutboundBatch,
    SendError,
    Settle,
    Transport,
    TransportUnavailableError,
)

if TYPE_CHECKING:
    from relayer.settings import StoreSettings

# Positive answers of require_ordered kept per store, evicted first-in-first-out.
CAPACITY = 256


class PreparationError(RelayerError):
    """A row cannot be sent as it is (its transport or destination cannot be used); its key
    is parked, or an unordered row retried later, with this message."""


class Fault(Enum):
    """Whose fault a failed send is."""

    ROW = "row"  # the row's: an attempt is counted against it (and its key)
    BROKER = "broker"  # the broker cannot be used now: no attempt counted, tried again later
    STOPPED = "stopped"  # the send was abandoned (the worker is stopping): the row stays unsent


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one error means for the row it concerns (``classify``)."""

    fault: Fault
    text: str  # the row's last_error, or why its broker cannot be used
    kind: str  # the error's qualified type name (OpenTelemetry's error.type)
    permanent: bool = False  # a row's fault that only an operator's change can fix


def classify(error: BaseException) -> Verdict:
    """The one reading of a send's, an acknowledgement's or a capability lookup's error."""
    kind = error_type(error)
    if isinstance(error, SendError):
        return Verdict(Fault.ROW, str(error), kind, permanent=not error.retryable)
    if isinstance(error, PreparationError):
        return Verdict(Fault.ROW, str(error), kind)
    if isinstance(error, TransportError):
        return Verdict(Fault.BROKER, str(error), kind)
    if isinstance(error, asyncio.CancelledError):
        return Verdict(Fault.STOPPED, "cancelled", kind)
    return Verdict(Fault.ROW, f"{type(error).__name__}: {error}", kind)


def error_type(error: BaseException) -> str:
    """The qualified name of ``error``'s type (OpenTelemetry's ``error.type``); for a row
    that cannot be sent as it is, its cause's (a missing topic's DestinationError, say)."""
    if isinstance(error, PreparationError) and error.__cause__ is not None:
        error = error.__cause__
    kind = type(error)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


class Routing:
    """One store's transports by name, what rows are handed to, and which destinations keep
    per-key order."""

    __slots__ = ("_publishers", "default", "destinations", "store_name", "transports")

    def __init__(
        self,
        store: StoreSettings,
        transports: Mapping[str, Transport],
        *,
        destinations: DestinationCache | None = None,
    ) -> None:
        self.store_name = store.name
        self.default = store.default_transport
        self.transports = dict(transports)
        self.destinations = destinations or DestinationCache()
        self._publishers: dict[str, BatchPublisher] = {}

    def transport(self, name: str | None) -> Transport:
        """The transport rows naming ``name`` go to (None: the store's default), or a
        PreparationError saying what to configure."""
        name = name or self.default
        store = self.store_name
        if name is None:
            raise PreparationError(
                f"the row names no transport and store {store!r} has no default_transport; "
                f"set stores.{store}.default_transport, then redrive the key"
            )
        transport = self.transports.get(name)
        if transport is None:
            known = ", ".join(repr(known) for known in self.transports) or "none"
            raise PreparationError(
                f"transport {name!r} is not configured for store {store!r} (configured: "
                f"{known}); add [stores.{store}.transports.{name}] and restart the workers, or "
                "drop the key"
            )
        return transport

    def publisher(self, transport: Transport) -> BatchPublisher:
        """What the send pipeline hands ``transport``'s rows to: the transport itself if it
        publishes in batches, else one ``publish`` a message (``PerMessage``).

        A transport publishes in batches if it has ``publish_batch``. That is asked with
        ``hasattr``, once per transport, not ``isinstance`` against the runtime-checkable
        protocol: the protocol check looks up every member each time."""
        publisher = self._publishers.get(transport.name)
        if publisher is None:
            if hasattr(transport, "publish_batch"):
                publisher = cast(BatchPublisher, transport)
            else:
                publisher = PerMessage(transport)
            self._publishers[transport.name] = publisher
        return publisher

    async def require_ordered(self, transport: Transport, destination: str) -> None:
        """Return if ``destination`` keeps per-key order (see ``DestinationCache``)."""
        await self.destinations.require_ordered(transport, destination)


class DestinationCache:
    """Which destinations keep per-key order natively, asked once and remembered (a little).

    Before the first send to a (transport, destination), the relay asks the transport. At most
    ``capacity`` positive answers are kept, evicted first-in-first-out (a hit does not refresh
    an entry). Failed lookups and destinations without native ordering are never cached, so
    they recover on a later attempt without a restart.
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._ordered: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.lookups = 0

    def __len__(self) -> int:
        return len(self._ordered)

    def __contains__(self, entry: tuple[str, str]) -> bool:
        return entry in self._ordered

    async def require_ordered(self, transport: Transport, destination: str) -> None:
        """Return if ``destination`` keeps per-key order; PreparationError otherwise, or the
        transport's TransportUnavailableError when its broker cannot be reached."""
        entry = (transport.name, destination)
        if entry in self._ordered:
            return
        self.lookups += 1
        try:
            ordered = await transport.ordered_by_key(destination)
        except TransportUnavailableError:
            raise  # the broker cannot be reached: not the row's fault, no attempt counted
        except RelayerError as exc:
            raise PreparationError(
                f"cannot check destination {destination!r} of transport {transport.name!r}: "
                f"{exc}; once that is fixed, the key's next retry sends it (or redrive it)"
            ) from exc
        if not ordered:
            raise PreparationError(
                f"destination {destination!r} of transport {transport.name!r} does not keep "
                "per-key order natively, so ordered rows cannot be sent to it; send them to a "
                "destination that does (see docs/transports.md), then redrive the key"
            )
        self._ordered[entry] = None
        if len(self._ordered) > self.capacity:
            self._ordered.popitem(last=False)


class PerMessage:
    """``publish_batch`` for a transport that only has ``publish``: one awaitable a message."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    async def publish_batch(
        self,
        batch: OutboundBatch,
        indexes: Sequence[int],
        settle: Settle,
        admitting: Callable[[], bool],
    ) -> int:
        for handed, index in enumerate(indexes):
            if handed and not admitting():
                return handed
            try:
                acknowledgement = await self.transport.publish(batch.message(index))
            except Exception as exc:
                if classify(exc).fault is Fault.BROKER:
                    raise  # the client cannot be used now: the caller stops the transport
                settle(index, exc)  # the row's fault (a plug-in's bug too): only its key
                return handed
            future = (
                acknowledgement
                if isinstance(acknowledgement, asyncio.Future)
                else asyncio.ensure_future(acknowledgement)
            )
            if future.done():
                _settle_from(settle, index, future)
                if future.cancelled() or future.exception() is not None:
                    return handed  # failed at once: the caller stops its key first
            else:
                future.add_done_callback(functools.partial(_settle_from, settle, index))
        return len(indexes)


def _settle_from(settle: Settle, index: int, future: asyncio.Future[None]) -> None:
    if future.cancelled():
        settle(index, asyncio.CancelledError())
    else:
        settle(index, future.exception())
