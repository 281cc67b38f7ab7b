"""An in-memory transport with fault injection, for the relay's tests and for users' tests.

``MemoryTransport`` records what each destination received and in which order publishes were
initiated and acknowledged. Faults are injected with methods: fail the next N publishes, fail
every message of a key, stall acknowledgements (until released or for a delay), declare a
destination unordered or unknown, fail ``start()``, lose the connection (``disconnect``:
held outcomes fail and publishes raise TransportUnavailableError until ``reconnect``).
Everything is deterministic: without a stall a publish is acknowledged (or failed) before
``publish`` returns; the only timers are the explicit stall delays.

With ``pipelines_within_key`` (the default) it behaves like Kafka's gapless producer: once a
message of key K to destination D fails, every later message of K to D that was published
before that failure was reported fails too (and is not received). A failure counts as reported
once its awaitable is done, which is when the relay can see it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from relayer.errors import TransportError
from relayer.transports.base import (
    DestinationError,
    OutboundBatch,
    OutgoingMessage,
    SendError,
    Settle,
    TransportUnavailableError,
)
from relayer.transports.options import Options
from relayer.transports.routing import PerMessage

_KNOWN_OPTIONS = "pipelines_within_key, unordered_destinations, unknown_destinations"


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    """The outcome of one publish, in the order outcomes were reported."""

    message: OutgoingMessage
    error: SendError | TransportUnavailableError | None

    @property
    def ok(self) -> bool:
        return self.error is None


_Entry = OutgoingMessage | tuple[OutboundBatch, int]


def _message(entry: _Entry) -> OutgoingMessage:
    if isinstance(entry, OutgoingMessage):
        return entry
    batch, index = entry
    return batch.message(index)


@dataclass(frozen=True, slots=True)
class _Fault:
    retryable: bool
    message: str


@dataclass(slots=True, eq=False)
class _Pending:
    message: OutgoingMessage
    future: asyncio.Future[None]
    error: SendError | TransportUnavailableError | None
    # True while this failure stops later in-flight messages of its key (gapless mode).
    blocks_key: bool = False


class MemoryTransport:
    """A fault-injectable transport that keeps everything it was sent in memory."""

    def __init__(
        self,
        name: str = "memory",
        *,
        pipelines_within_key: bool = True,
        unordered_destinations: Iterable[str] = (),
        unknown_destinations: Iterable[str] = (),
    ) -> None:
        self._name = name
        self._pipelines_within_key = pipelines_within_key
        self._unordered = set(unordered_destinations)
        self._unknown: dict[str, str] = {
            destination: _unknown_text(destination) for destination in unknown_destinations
        }
        # Messages, or (batch, index) of rows handed over by publish_batch: made into messages
        # only when inspected (the relay's benchmark sends through here).
        self._received: dict[str, list[_Entry]] = {}
        self._all: list[_Entry] = []
        self._published: list[_Entry] = []
        # (message, error) pairs; Acknowledgement objects are built only when asked for.
        self._acknowledged: list[tuple[_Entry, SendError | TransportUnavailableError | None]] = []
        self._lookups: list[str] = []
        self._held: deque[_Pending] = deque()
        self._timers: set[asyncio.TimerHandle] = set()
        self._unreported: dict[tuple[str, str], int] = {}
        self._fail_next: deque[_Fault] = deque()
        self._failing_keys: dict[str, _Fault] = {}
        self._failing_ids: dict[UUID, _Fault] = {}
        self._start_error: BaseException | None = None
        self._stalled = False
        self._stall_delay: float | None = None
        self._offline: str | None = None
        self.started = False
        self.closed = False

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> MemoryTransport:
        """The ``memory`` factory: options as in ``[stores.X.transports.Y]``."""
        reader = Options(options)
        transport = cls(
            name,
            pipelines_within_key=reader.flag("pipelines_within_key", True),
            unordered_destinations=reader.names("unordered_destinations"),
            unknown_destinations=reader.names("unknown_destinations"),
        )
        reader.reject_unread("memory", _KNOWN_OPTIONS)
        return transport

    # -- the Transport contract ---------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def pipelines_within_key(self) -> bool:
        return self._pipelines_within_key

    async def start(self) -> None:
        if self._start_error is not None:
            raise self._start_error
        self.started = True
        self.closed = False

    async def ordered_by_key(self, destination: str) -> bool:
        self._lookups.append(destination)
        if destination in self._unknown:
            raise DestinationError(self._unknown[destination])
        return destination not in self._unordered

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        if not self.started or self.closed:
            state = "closed" if self.closed else "not started"
            raise TransportError(
                f"memory transport {self._name!r} is {state}; call start() before publish()"
            )
        if self._offline is not None:
            raise TransportUnavailableError(self._offline)
        self._published.append(message)
        if not self._faulty():
            # The common case, kept cheap: the relay's benchmark publishes through here.
            self._received.setdefault(message.destination, []).append(message)
            self._all.append(message)
            future = asyncio.get_running_loop().create_future()
            future.set_result(None)
            self._acknowledged.append((message, None))
            return future
        error = self._outcome(message)
        if error is None:
            self._received.setdefault(message.destination, []).append(message)
            self._all.append(message)
        blocks_key = error is not None and self._pipelines_within_key and message.key is not None
        if blocks_key:
            lane = (message.destination, message.key or "")
            self._unreported[lane] = self._unreported.get(lane, 0) + 1
        pending = _Pending(message, asyncio.get_running_loop().create_future(), error, blocks_key)
        if not self._stalled:
            self._resolve(pending)
        else:
            self._held.append(pending)
            if self._stall_delay is not None:
                self._release_later(pending, self._stall_delay)
        return pending.future

    async def publish_batch(
        self,
        batch: OutboundBatch,
        indexes: Sequence[int],
        settle: Settle,
        admitting: Callable[[], bool],
    ) -> int:
        """``publish`` for many rows at once (the relay's way); same faults, same records."""
        if (
            self._faulty()
            or self._offline is not None
            or not self.started
            or self.closed
            or type(self).publish is not MemoryTransport.publish  # a test's own publish
        ):
            return await PerMessage(self).publish_batch(batch, indexes, settle, admitting)
        received = self._received
        published = self._published
        everything = self._all
        acknowledged = self._acknowledged
        destinations = batch.destinations
        for index in indexes:
            entry = (batch, index)
            published.append(entry)
            received.setdefault(destinations[index], []).append(entry)
            everything.append(entry)
            acknowledged.append((entry, None))
            settle(index, None)
        return len(indexes)

    async def close(self) -> None:
        """Report every held outcome (a stall ends), then refuse further publishes."""
        self.release()
        self._stalled = False
        self.closed = True

    # -- inspection ------------------------------------------------------------------

    def received(self, destination: str) -> list[OutgoingMessage]:
        """What ``destination`` accepted, in the order it accepted it."""
        return [_message(entry) for entry in self._received.get(destination, ())]

    def received_all(self) -> list[OutgoingMessage]:
        """What every destination accepted, in one list, in acceptance order."""
        return [_message(entry) for entry in self._all]

    @property
    def destinations(self) -> list[str]:
        return list(self._received)

    @property
    def published(self) -> list[OutgoingMessage]:
        """Every message handed to ``publish``, in the order publishes were initiated."""
        return [_message(entry) for entry in self._published]

    @property
    def acknowledged(self) -> list[Acknowledgement]:
        """Every reported outcome, in the order outcomes were reported."""
        return [Acknowledgement(_message(entry), error) for entry, error in self._acknowledged]

    @property
    def lookups(self) -> list[str]:
        """Destinations passed to ``ordered_by_key``, one entry per call."""
        return list(self._lookups)

    @property
    def held(self) -> int:
        """How many outcomes a stall is holding back."""
        return len(self._held)

    def forget(self) -> None:
        """Drop every recorded message, outcome and lookup (faults stay as they are)."""
        for record in (self._received, self._all, self._published, self._acknowledged):
            record.clear()
        self._lookups.clear()

    # -- fault injection -------------------------------------------------------------

    def fail_next(
        self, count: int = 1, *, retryable: bool = True, message: str = "injected failure"
    ) -> None:
        """Fail the next ``count`` publishes with SendError(``message``, retryable=...)."""
        self._fail_next.extend(_Fault(retryable, message) for _ in range(count))

    def fail_key(
        self, key: str, *, retryable: bool = True, message: str = "injected failure"
    ) -> None:
        """Fail every message of ``key`` (any destination) until ``clear_key``."""
        self._failing_keys[key] = _Fault(retryable, message)

    def fail_message(
        self, message_id: UUID, *, retryable: bool = True, message: str = "injected failure"
    ) -> None:
        """Fail the publish of the message with this outbox id (every time, until cleared)."""
        self._failing_ids[message_id] = _Fault(retryable, message)

    def clear_key(self, key: str) -> None:
        self._failing_keys.pop(key, None)

    def clear_faults(self) -> None:
        """Forget pending ``fail_next`` counts, failing keys and ids (stalls stay)."""
        self._fail_next.clear()
        self._failing_keys.clear()
        self._failing_ids.clear()

    def stall(self, delay: float | None = None) -> None:
        """Accept publishes but hold their outcomes until ``release`` (or ``delay`` seconds)."""
        self._stalled = True
        self._stall_delay = delay

    def release(self, count: int | None = None) -> int:
        """Report the oldest ``count`` held outcomes (all by default); returns how many."""
        released = 0
        while self._held and (count is None or released < count):
            self._resolve(self._held.popleft())
            released += 1
        return released

    def resume(self) -> None:
        """End the stall and report everything it held."""
        self._stalled = False
        self._stall_delay = None
        self.release()
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def disconnect(self, reason: str = "injected connection loss") -> None:
        """Lose the connection: held outcomes fail and publishes raise, until ``reconnect``.

        Messages whose outcome was held stay received (the broker may have them even though
        no acknowledgement came back), as after a real connection loss.
        """
        self._offline = f"memory transport {self._name!r}: {reason}"
        while self._held:
            pending = self._held.popleft()
            pending.error = TransportUnavailableError(self._offline)
            self._resolve(pending)

    def reconnect(self) -> None:
        self._offline = None

    def declare_unordered(self, destination: str) -> None:
        self._unordered.add(destination)

    def declare_ordered(self, destination: str) -> None:
        self._unordered.discard(destination)
        self._unknown.pop(destination, None)

    def declare_unknown(self, destination: str, message: str | None = None) -> None:
        """``ordered_by_key`` raises DestinationError; publishes fail, not retryable."""
        self._unknown[destination] = message or _unknown_text(destination)

    def fail_start(self, error: BaseException | None = None) -> None:
        """Make ``start()`` raise ``error`` (a TransportError by default) until cleared."""
        self._start_error = error or TransportError(
            f"memory transport {self._name!r}: injected start failure"
        )

    def clear_start_failure(self) -> None:
        self._start_error = None

    # -- internals -------------------------------------------------------------------

    def _outcome(self, message: OutgoingMessage) -> SendError | None:
        if message.key is not None and self._unreported.get((message.destination, message.key)):
            return SendError(
                f"an earlier message of key {message.key!r} to {message.destination!r} failed "
                "and this one was already in flight (gapless producer); it will be retried"
            )
        if self._fail_next:
            fault = self._fail_next.popleft()
            return SendError(fault.message, retryable=fault.retryable)
        if message.id in self._failing_ids:
            fault = self._failing_ids[message.id]
            return SendError(fault.message, retryable=fault.retryable)
        if message.key is not None and message.key in self._failing_keys:
            fault = self._failing_keys[message.key]
            return SendError(fault.message, retryable=fault.retryable)
        if message.destination in self._unknown:
            return SendError(self._unknown[message.destination], retryable=False)
        return None

    def _resolve(self, pending: _Pending) -> None:
        if pending.future.done():
            return
        message, error = pending.message, pending.error
        if error is None:
            pending.future.set_result(None)
        else:
            pending.future.set_exception(error)
            if pending.blocks_key:
                lane = (message.destination, message.key or "")
                remaining = self._unreported.get(lane, 0) - 1
                if remaining > 0:
                    self._unreported[lane] = remaining
                else:
                    self._unreported.pop(lane, None)
        self._acknowledged.append((message, error))

    def _faulty(self) -> bool:
        return bool(
            self._stalled
            or self._fail_next
            or self._failing_ids
            or self._failing_keys
            or self._unknown
            or self._unreported
        )

    def _release_later(self, pending: _Pending, delay: float) -> None:
        def fire() -> None:
            self._timers.discard(timer)
            if pending in self._held:
                # Outcomes are reported in publish order, so release up to this one.
                while self._held and self._held[0] is not pending:
                    self._resolve(self._held.popleft())
                if self._held:
                    self._resolve(self._held.popleft())

        timer = asyncio.get_running_loop().call_later(delay, fire)
        self._timers.add(timer)


def _unknown_text(destination: str) -> str:
    return (
        f"destination {destination!r} is unknown to the memory transport; "
        "fix the destination or declare it with declare_ordered()"
    )
