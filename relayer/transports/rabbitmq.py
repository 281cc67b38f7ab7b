"""RabbitMQ through aio-pika: publisher confirms, mandatory routing, pipelined on one channel.

Options: ``url`` (required, ``amqp://user:password@host:5672/vhost`` or ``amqps://...``),
``ordered_destinations`` (destinations or exchange names the operator declares per-key ordered,
see below), ``max_outstanding`` (unconfirmed publishes before ``publish`` waits, default
5,000), ``connect_timeout``, ``close_timeout`` and ``reconnect_interval`` (seconds).
Destinations are described in ``rabbitmq_routes``.

Every message is persistent, published with ``mandatory=True`` (an unroutable message fails
with a non-retryable SendError instead of being dropped), carries the outbox id as AMQP
``message_id`` and in the ``relayer-message-id`` header, and the ordering key in the
``relayer-ordering-key`` header. Publishes are written on one channel in the order they are
queued (a publish to an exchange not yet checked waits for the check) and many confirms may be
outstanding. The publishes of one event-loop turn go out together (in writes of about 1 MiB),
and a publish waits while the last write is still in the socket buffer (backpressure).
RabbitMQ has no gapless guarantee, so ``pipelines_within_key`` is False: the relay waits for a
key's confirm before publishing its next row.

Per-key order is native for a single queue (``/queue``: checked with a passive declare). An
exchange keeps it only if every key reaches one queue, e.g. a consistent-hash exchange whose
queues have single-active-consumer; AMQP cannot show an exchange's type or bindings (only the
management API can), so such destinations are listed in ``ordered_destinations``.

Connections are plain, not robust: when one is lost, aiormq fails every outstanding confirm
(the relay keeps those rows and retries) and the next publish reconnects. A robust connection
would restore channels in the background but not replay publishes, and its half-restored
states are harder to reason about than "failed, retried, reconnected".
"""

from __future__ import annotations

import asyncio
import collections
import functools
import importlib.metadata
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
import pamqp.frame
from aiormq import spec
from aiormq.abc import ChannelFrame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from relayer.errors import TransportError
from relayer.redact import redact
from relayer.transports.base import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    DestinationError,
    OutgoingMessage,
    SendError,
    TransportUnavailableError,
)
from relayer.transports.options import Options, TransportOptionError
from relayer.transports.rabbitmq_routes import Route, RouteError, parse_route

logger = logging.getLogger(__name__)

_KNOWN_OPTIONS = (
    "url, ordered_destinations, max_outstanding, connect_timeout, close_timeout, reconnect_interval"
)
_PERSISTENT = 2
# Publishes of one event-loop turn are joined into writes of about this many bytes.
_WRITE_BYTES = 1 << 20
# AMQP field-table names are short strings of at most 128 bytes; the client would cut a longer
# header name short without a word, so such a message is failed instead.
_MAX_HEADER_NAME_BYTES = 128


class RabbitMQTransport:
    """Publishes to RabbitMQ exchanges and queues with publisher confirms."""

    def __init__(
        self,
        name: str,
        url: str,
        *,
        ordered_destinations: Iterable[str] = (),
        max_outstanding: int = 5_000,
        connect_timeout: float = 10.0,
        close_timeout: float = 30.0,
        reconnect_interval: float = 1.0,
    ) -> None:
        self._name = name
        self._url = url
        self._shown_url = redact(url)
        self._ordered = frozenset(ordered_destinations)
        self._connect_timeout = connect_timeout
        self._close_timeout = close_timeout
        self._reconnect_interval = reconnect_interval
        self._slots = asyncio.Semaphore(max_outstanding)
        self._connection: Any = None
        self._channel: Any = None
        self._underlay: Any = None
        self._connect_lock = asyncio.Lock()
        self._last_failure: tuple[float, str] | None = None
        self._routes: dict[str, Route | str] = {}
        self._exchanges: set[str] = set()
        self._outstanding: set[asyncio.Future[None]] = set()
        self._queued: list[_Queued] = []
        self._queued_bytes = 0
        self._flush_scheduled = False
        self._frames: collections.deque[ChannelFrame] = collections.deque()
        self._pump: asyncio.Task[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._started = False
        self._closed = False

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> RabbitMQTransport:
        """The ``rabbitmq`` factory: options as in ``[stores.X.transports.Y]``."""
        reader = Options(options)
        url = reader.text("url")
        if not url:
            raise TransportOptionError(
                "url", url, "is required: amqp://user:password@host:5672/vhost (or amqps://)"
            )
        if not url.lower().startswith(("amqp://", "amqps://")):
            raise TransportOptionError("url", url, "must start with amqp:// or amqps://")
        transport = cls(
            name,
            url,
            ordered_destinations=reader.names("ordered_destinations"),
            max_outstanding=reader.integer("max_outstanding", 5_000, low=1),
            connect_timeout=reader.seconds("connect_timeout", 10.0),
            close_timeout=reader.seconds("close_timeout", 30.0),
            reconnect_interval=reader.seconds("reconnect_interval", 1.0),
        )
        reader.reject_unread("rabbitmq", _KNOWN_OPTIONS)
        return transport

    def __repr__(self) -> str:
        return f"RabbitMQTransport(name={self._name!r}, url={self._shown_url!r})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def pipelines_within_key(self) -> bool:
        return False

    async def start(self) -> None:
        self._started = True
        self._closed = False
        await self._ensure_channel(force=True)
        logger.info(
            "RabbitMQ transport %s connected to %s",
            self._name,
            self._shown_url,
            extra={"action": "transport_start"},
        )

    async def ordered_by_key(self, destination: str) -> bool:
        """True for a queue that exists, or an existing exchange the operator listed."""
        route = self._route(destination)
        if isinstance(route, str):
            raise DestinationError(route)
        await self._ensure_channel(force=True)  # unreachable: TransportUnavailableError
        problem = await self._check_exists(route)
        if problem is not None:
            raise DestinationError(problem)
        if route.queue is not None:
            return True
        return destination in self._ordered or route.exchange in self._ordered

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        if not self._started or self._closed:
            raise TransportError(
                f"RabbitMQ transport {self._name!r} is "
                f"{'closed' if self._closed else 'not started'}; call start() before publish()"
            )
        route = self._route(message.destination)
        try:
            if isinstance(route, str):
                raise SendError(route, retryable=False)
            routing_key = route.routing_key_for(message.key)
            underlay = await self._ensure_channel(force=False)
            if route.exchange and route.exchange not in self._exchanges:
                problem = await self._check_exists(route)
                if problem is not None:
                    raise SendError(problem, retryable=False)
        except RouteError as exc:
            return _failed(SendError(str(exc), retryable=False))
        except SendError as exc:
            return _failed(exc)
        drained = self._drained
        if drained is not None and not drained.done():
            # Backpressure: the previous write is still in the socket's buffer (a slow or
            # blocked broker); queue nothing more until it has gone out. Other publishes wait
            # on the same future: asyncio.wait neither cancels it when this caller is
            # cancelled (a batch deadline) nor raises its error (a lost connection, which the
            # flush sees).
            await asyncio.wait((drained,))
        headers: dict[str, Any] = dict(message.headers) if message.headers else {}
        for name in headers:
            if len(name.encode()) > _MAX_HEADER_NAME_BYTES:
                return _failed(SendError(_long_header_name(name), retryable=False))
        message_id = message.id_text
        headers[MESSAGE_ID_HEADER] = message_id
        if message.key is not None:
            headers[ORDERING_KEY_HEADER] = message.key
        properties = spec.Basic.Properties(
            delivery_mode=_PERSISTENT, message_id=message_id, headers=headers
        )
        try:
            payload = _marshal(underlay, route.exchange, routing_key, message.body, properties)
        except Exception as exc:  # pamqp refuses a value AMQP cannot carry
            return _failed(
                SendError(
                    f"cannot encode the message for RabbitMQ ({type(exc).__name__}: {exc}); "
                    "fix the row's headers or destination",
                    retryable=False,
                )
            )
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        settled: asyncio.Future[None] = loop.create_future()
        self._outstanding.add(settled)
        settled.add_done_callback(self._outstanding.discard)
        self._queued.append(_Queued(underlay, payload, message_id, route, routing_key, settled))
        self._queued_bytes += len(payload)
        if self._queued_bytes >= _WRITE_BYTES:
            self._flush()  # now: the next publish waits for this write to drain
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return settled

    async def close(self) -> None:
        """Wait for outstanding confirms (up to ``close_timeout``), then disconnect."""
        if self._closed:
            return
        self._closed = True
        self._flush()
        pending = list(self._outstanding)
        if pending:
            _, late = await asyncio.wait(pending, timeout=self._close_timeout)
            if late:
                logger.warning(
                    "RabbitMQ transport %s closes with %s unconfirmed messages",
                    self._name,
                    len(late),
                    extra={"action": "transport_close", "rows": len(late)},
                )
        async with self._connect_lock:  # not while a reconnect is half done
            await self._disconnect()
        if pending:
            await asyncio.wait(pending)

    # -- internals -------------------------------------------------------------------

    def _route(self, destination: str) -> Route | str:
        route = self._routes.get(destination)
        if route is None:
            try:
                route = parse_route(destination)
            except RouteError as exc:
                route = str(exc)
            if len(self._routes) < 10_000:
                self._routes[destination] = route
        return route

    def _flush(self) -> None:
        """Write every publish queued in this event-loop turn, in order, in writes of about
        1 MiB.

        Only this transport writes on its publishing channel, so taking the next delivery tags
        and registering their confirmations here (with no await in between) numbers the
        messages exactly as the broker will: aiormq resolves those futures from the broker's
        acks, nacks and returns, and fails them all if the channel or connection is lost.
        Writing many publishes at once spares a task, a channel lock and a socket write per
        message; they were aio-pika's main cost per message.
        """
        self._flush_scheduled = False
        queued, self._queued = self._queued, []
        self._queued_bytes = 0
        writes: list[bytes] = []
        payloads: list[bytes] = []
        size = 0
        underlay = self._underlay
        # The broker may have closed the channel already: aiormq forgets its number at once,
        # is_closed follows a few turns later. Publishes written then would be a protocol error.
        usable = (
            underlay is not None
            and not underlay.is_closed
            and underlay.connection.channels.get(underlay.number) is underlay
        )
        for item in queued:
            if not usable or item.underlay is not underlay:
                lost = _lost(item.route, ConnectionError("channel closed"))
                self._settle_unwritten(item, lost)
                continue
            if item.message_id in underlay.message_id_delivery_tag:
                # A basic.return names the message by its id: with two copies unconfirmed, a
                # return could fail the wrong one. The earlier copy settles first.
                self._settle_unwritten(item, _still_unconfirmed(item.message_id))
                continue
            underlay.delivery_tag += 1
            tag = underlay.delivery_tag
            confirmation = underlay.create_future()
            underlay.confirmations[tag] = confirmation
            underlay.message_id_delivery_tag[item.message_id] = tag
            confirmation.add_done_callback(functools.partial(self._settle, item, tag))
            payloads.append(item.payload)
            size += len(item.payload)
            if size >= _WRITE_BYTES:  # large messages: several writes, not one huge copy
                writes.append(b"".join(payloads))
                payloads, size = [], 0
        if payloads:
            writes.append(b"".join(payloads))
        if not writes:
            return
        # The writer resolves this once the turn's last write has left the socket buffer.
        self._drained = underlay.create_future()
        last = len(writes) - 1
        for number, payload in enumerate(writes):
            drained = self._drained if number == last else None
            self._frames.append(ChannelFrame(payload, should_close=False, drain_future=drained))
        self._write_frames(underlay)

    def _write_frames(self, underlay: Any) -> None:
        """Hand written frames to aiormq's connection writer, in order; when its small queue
        is full, one task waits for room (later frames queue behind it)."""
        if self._pump is not None:
            return
        queue: asyncio.Queue[ChannelFrame] = underlay.write_queue
        while self._frames and not queue.full():
            queue.put_nowait(self._frames.popleft())
        if self._frames:
            self._pump = asyncio.get_running_loop().create_task(self._pump_frames(queue))

    async def _pump_frames(self, queue: asyncio.Queue[ChannelFrame]) -> None:
        try:
            while self._frames:
                await queue.put(self._frames[0])
                self._frames.popleft()
        finally:
            if self._pump is asyncio.current_task():
                self._pump = None

    def _settle(self, item: _Queued, tag: int, confirmation: asyncio.Future[Any]) -> None:
        """The broker's answer for one message, as the relay understands it."""
        underlay = item.underlay
        if underlay.message_id_delivery_tag.get(item.message_id) == tag:
            del underlay.message_id_delivery_tag[item.message_id]
        self._slots.release()
        if item.settled.done():
            return
        cancelled = confirmation.cancelled()
        error = asyncio.CancelledError() if cancelled else confirmation.exception()
        if error is None:
            item.settled.set_result(None)
            return
        route, routing_key = item.route, item.routing_key
        if isinstance(error, aiormq.exceptions.PublishError):
            item.settled.set_exception(
                SendError(_unroutable(route, routing_key, error), retryable=False)
            )
        elif isinstance(error, aiormq.exceptions.DeliveryError):
            item.settled.set_exception(
                SendError(
                    f"RabbitMQ refused (nack) a message for {route.destination!r}: the queue "
                    "may be full with overflow=reject-publish; the message will be retried"
                )
            )
        elif isinstance(error, aiormq.exceptions.ChannelNotFoundEntity):
            # The broker closed the channel (an exchange was deleted): every outstanding
            # confirm on it fails. The next publish re-checks the exchange on a new channel.
            self._exchanges.clear()
            item.settled.set_exception(
                TransportUnavailableError(
                    f"RabbitMQ closed the publishing channel ({redact(str(error))}) before it "
                    f"confirmed a message for {route.destination!r}; it will be sent again"
                )
            )
        else:  # a lost channel/connection fails every outstanding confirm
            item.settled.set_exception(_lost(route, error))

    def _settle_unwritten(self, item: _Queued, error: Exception) -> None:
        """A queued publish that is not written: its slot back, ``error`` to the relay."""
        self._slots.release()
        if not item.settled.done():
            item.settled.set_exception(error)

    async def _ensure_channel(self, *, force: bool) -> Any:
        """The publishing channel, reconnecting when it or its connection was lost."""
        if self._underlay is not None and not self._channel.is_closed:
            return self._underlay
        async with self._connect_lock:
            if self._closed:
                raise TransportError(f"RabbitMQ transport {self._name!r} is closed")
            if self._underlay is not None and not self._channel.is_closed:
                return self._underlay
            if not force and self._last_failure is not None:
                since, reason = self._last_failure
                if time.monotonic() - since < self._reconnect_interval:
                    raise TransportUnavailableError(reason)
            # A lost channel usually means a lost connection (whose object may not know it
            # yet): start over with both.
            await self._disconnect()
            try:
                if self._connection is None:
                    self._connection = await aio_pika.connect(
                        self._url,
                        timeout=self._connect_timeout,
                        client_properties={"connection_name": f"relayer {self._name}"},
                    )
                self._channel = await self._connection.channel(
                    publisher_confirms=True, on_return_raises=True
                )
                underlay = await self._channel.get_underlay_channel()
                _require_supported(underlay)
                self._underlay = underlay
            except _UnsupportedClient:
                await self._disconnect()
                raise
            except Exception as exc:  # every connect failure becomes one clear message
                reason = (
                    f"cannot connect RabbitMQ transport {self._name!r} to {self._shown_url}: "
                    f"{type(exc).__name__}: {redact(str(exc))}; check the url, credentials "
                    "and that the broker runs"
                )
                self._last_failure = (time.monotonic(), reason)
                await self._disconnect()
                raise TransportUnavailableError(reason) from exc
            if self._closed:  # close() was called while connecting
                await self._disconnect()
                raise TransportError(f"RabbitMQ transport {self._name!r} is closed")
            self._last_failure = None
            self._exchanges.clear()
            logger.debug(
                "RabbitMQ transport %s opened a publishing channel",
                self._name,
                extra={"action": "transport_connect"},
            )
            return self._underlay

    async def _check_exists(self, route: Route) -> str | None:
        """Passive-declare the route's queue or exchange on a throw-away channel.

        A failed passive declare closes its channel, so never on the publishing one.
        """
        assert self._connection is not None
        try:
            async with self._connection.channel(publisher_confirms=False) as channel:
                if route.queue is not None:
                    await channel.declare_queue(route.queue, passive=True)
                else:
                    await channel.get_exchange(route.exchange, ensure=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            if route.queue is not None:
                return (
                    f"RabbitMQ queue {route.queue!r} does not exist (destination "
                    f"{route.destination!r}); declare the queue or fix the destination"
                )
            return (
                f"RabbitMQ exchange {route.exchange!r} does not exist (destination "
                f"{route.destination!r}); declare the exchange or fix the destination"
            )
        except aiormq.exceptions.ChannelAccessRefused:
            return (
                f"not allowed to access {route.destination!r} on RabbitMQ; grant the relay's "
                "user configure/write permission on it"
            )
        except Exception as exc:  # a connection problem, not a property of the destination
            raise TransportUnavailableError(
                f"cannot look up RabbitMQ destination {route.destination!r}: "
                f"{type(exc).__name__}: {redact(str(exc))}"
            ) from exc
        if route.exchange:
            self._exchanges.add(route.exchange)
        return None

    async def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        self._channel = self._underlay = None
        # Frames not yet handed to the old connection die with it (their confirmations fail
        # when it closes); frames for the next connection must not queue behind them.
        self._frames.clear()
        if self._pump is not None:
            self._pump.cancel()
            self._pump = None
        if connection is not None and not connection.is_closed:
            try:
                await connection.close()
            except Exception as exc:  # closing a broken connection may fail; it is gone anyway
                logger.debug("closing the RabbitMQ connection failed: %s", redact(str(exc)))


class _UnsupportedClient(TransportError):
    """The installed aiormq lacks what the batched publishing relies on."""


# What the batched publishing uses of aiormq's channel (see RabbitMQTransport._flush).
_CHANNEL_ATTRIBUTES = (
    "delivery_tag",
    "confirmations",
    "message_id_delivery_tag",
    "write_queue",
    "max_content_size",
    "number",
    "connection",
    "create_future",
)


def _require_supported(underlay: Any) -> None:
    missing = [name for name in _CHANNEL_ATTRIBUTES if not hasattr(underlay, name)]
    if missing or not hasattr(underlay.connection, "channels"):
        raise _UnsupportedClient(
            f"the installed aiormq {_installed('aiormq')} lacks "
            f"{', '.join(missing) or 'connection.channels'} on its channels, which relayer's "
            "RabbitMQ transport uses; install aiormq 7.x (pip install 'aiormq>=7.2,<8')"
        )


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


@dataclass(slots=True)
class _Queued:
    """A marshalled publish waiting for this event-loop turn's write."""

    underlay: Any
    payload: bytes
    message_id: str
    route: Route
    routing_key: str
    settled: asyncio.Future[None]


def _marshal(
    underlay: Any, exchange: str, routing_key: str, body: bytes, properties: spec.Basic.Properties
) -> bytes:
    """The frames of one publish (method, content header, body frames of at most frame_max)."""
    channel, size = underlay.number, underlay.max_content_size
    frames: list[Any] = [
        spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True),
        ContentHeader(properties=properties, body_size=len(body)),
    ]
    frames.extend(ContentBody(body[start : start + size]) for start in range(0, len(body), size))
    return b"".join(pamqp.frame.marshal(frame, channel) for frame in frames)


def _still_unconfirmed(message_id: str) -> SendError:
    return SendError(
        f"an earlier copy of message {message_id} is still waiting for RabbitMQ's confirm; "
        "this copy will be sent again after it"
    )


def _lost(route: Route, error: BaseException) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"RabbitMQ connection or channel lost before the broker confirmed a message "
        f"for {route.destination!r} ({type(error).__name__}: {redact(str(error))}); "
        "the message will be sent again"
    )


def _long_header_name(name: str) -> str:
    return (
        f"header name {name[:40]!r}... is {len(name.encode()):,} bytes; AMQP header names are at "
        f"most {_MAX_HEADER_NAME_BYTES} bytes and RabbitMQ would receive it cut short; write the "
        "row with a shorter header name"
    )


def _failed(error: SendError) -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future


def _unroutable(route: Route, routing_key: str, exc: Exception) -> str:
    if route.queue is not None:
        return (
            f"RabbitMQ returned the message as unroutable: queue {route.queue!r} does not "
            f"exist (destination {route.destination!r}); declare the queue or fix the destination"
        )
    return (
        f"RabbitMQ returned the message as unroutable: no queue is bound to exchange "
        f"{route.exchange!r} for routing key {routing_key!r} (destination "
        f"{route.destination!r}); bind a queue or fix the destination"
    )
