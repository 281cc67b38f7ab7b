"""RabbitMQTransport: the transport the relay and unordered sending publish through (the
package's docstring says what it guarantees)."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
from aiormq import spec
from aiormq.abc import ChannelFrame

from relayer.errors import TransportError
from relayer.redact import redact
from relayer.transports.base import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    DestinationError,
    OutboundBatch,
    OutgoingMessage,
    SendError,
    Settle,
    TransportUnavailableError,
    fail_quietly,
)
from relayer.transports.options import Options, TransportOptionError
from relayer.transports.rabbitmq import frames
from relayer.transports.rabbitmq.routes import Route, RouteError, parse_route
from relayer.transports.stalls import StallNotice

# The package's name: every part of the transport logs as one (users filter on it).
logger = logging.getLogger("relayer.transports.rabbitmq")

_Settle = Callable[[BaseException | None], None]

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

    # OpenTelemetry's messaging.system for the relay's send spans (relayer.tracing).
    messaging_system = "rabbitmq"

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
        # Unconfirmed publishes, and their most before a publish waits (room is signalled by
        # _room once a confirm frees one).
        self._unconfirmed = 0
        self._max_outstanding = max_outstanding
        self._room = asyncio.Event()
        # How the current channel is written: the fast path's encoder and confirm tracking, or
        # None for aiormq's public basic_publish (see relayer.transports.rabbitmq.frames).
        self._encoder: frames.Encoder | None = None
        self._confirms: frames.Confirms | None = None
        self._warned_path = False
        self._fallback_tasks: set[asyncio.Task[None]] = set()
        self._connection: Any = None
        self._channel: Any = None
        self._underlay: Any = None
        self._connect_lock = asyncio.Lock()
        self._last_failure: tuple[float, str] | None = None
        # When the broker last confirmed a message (or a publish found none waiting); a stall
        # is said once, and when it is over.
        self._confirmed_at = time.monotonic()
        self._notice = StallNotice(
            logger,
            name,
            "RabbitMQ",
            "check the broker's alarms (rabbitmqctl status) and the network",
        )
        self._routes: dict[str, Route | str] = {}
        self._exchanges: set[str] = set()
        self._outstanding: set[asyncio.Future[None]] = set()  # publish()'s awaitables
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
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._outstanding.add(future)
        future.add_done_callback(self._outstanding.discard)
        settle = functools.partial(_settle_future, future)
        try:
            error = await self._enqueue(
                message.destination,
                key=message.key,
                message_id=message.id_text,
                body=message.body,
                extra_headers=message.headers,
                settle=settle,
            )
        except BaseException:  # nothing was queued (cancelled while waiting, or unusable)
            future.cancel()
            raise
        if error is not None:
            settle(error)
        return future

    async def publish_batch(
        self,
        batch: OutboundBatch,
        indexes: Sequence[int],
        settle: Settle,
        admitting: Callable[[], bool],
    ) -> int:
        """``publish`` for many rows (the relay's way): no awaitable per message."""
        destinations, keys, ids = batch.destinations, batch.keys, batch.ids
        bodies, headers = batch.bodies, batch.headers
        for handed, index in enumerate(indexes):
            if handed and self._must_wait() and not admitting():
                return handed
            error = await self._enqueue(
                destinations[index],
                key=keys[index],
                message_id=ids[index],
                body=bodies[index],
                extra_headers=headers[index],
                settle=functools.partial(settle, index),
            )
            if error is not None:
                settle(index, error)
                return handed
        return len(indexes)

    def _must_wait(self) -> bool:
        drained = self._drained
        return self._unconfirmed >= self._max_outstanding or (
            drained is not None and not drained.done()
        )

    async def _enqueue(
        self,
        destination: str,
        *,
        key: str | None,
        message_id: str,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        settle: _Settle,
    ) -> SendError | None:
        """Queue one publish for this turn's write; the error if it fails at once (SendError).
        Raises TransportError when the transport cannot be used (closed, unreachable)."""
        if not self._started or self._closed:
            raise TransportError(
                f"RabbitMQ transport {self._name!r} is "
                f"{'closed' if self._closed else 'not started'}; call start() before publish()"
            )
        route = self._route(destination)
        try:
            if isinstance(route, str):
                return SendError(route, retryable=False)
            routing_key = route.routing_key_for(key)
            underlay = await self._ensure_channel(force=False)
            if route.exchange and route.exchange not in self._exchanges:
                problem = await self._check_exists(route)
                if problem is not None:
                    return SendError(problem, retryable=False)
                underlay = await self._ensure_channel(force=False)
        except RouteError as exc:
            return SendError(str(exc), retryable=False)
        drained = self._drained
        if drained is not None and not drained.done():
            # Backpressure: the previous write is still in the socket's buffer (a slow or
            # blocked broker); queue nothing more until it has gone out. Other publishes wait
            # on the same future: asyncio.wait neither cancels it when this caller is
            # cancelled (a batch deadline) nor raises its error (a lost connection, which the
            # flush sees).
            await asyncio.wait((drained,))
        while self._unconfirmed >= self._max_outstanding:
            self._room.clear()
            await self._room.wait()
        headers: dict[str, str] = dict(extra_headers) if extra_headers else {}
        for name in headers:
            if len(name.encode()) > _MAX_HEADER_NAME_BYTES:
                return SendError(_long_header_name(name), retryable=False)
        headers[MESSAGE_ID_HEADER] = message_id
        if key is not None:
            headers[ORDERING_KEY_HEADER] = key
        encoder = self._encoder if underlay is self._underlay else None
        properties: spec.Basic.Properties | None = None
        try:
            if encoder is not None:
                payload = encoder.publish(route.exchange, routing_key, body, message_id, headers)
            else:  # the public path: basic_publish encodes it; refuse here what cannot be
                payload = b""
                properties = frames.reference_properties(message_id, headers)
                frames.reference_encoding(
                    underlay.number,
                    underlay.max_content_size,
                    exchange=route.exchange,
                    routing_key=routing_key,
                    body=b"",
                    properties=properties,
                )
        except Exception as exc:  # a value AMQP cannot carry
            return SendError(
                f"cannot encode the message for RabbitMQ ({type(exc).__name__}: {exc}); "
                "fix the row's headers or destination",
                retryable=False,
            )
        if not self._unconfirmed:  # nothing waited for a confirm: nothing is overdue
            self._confirmed_at = time.monotonic()
        self._unconfirmed += 1
        item = _Queued(underlay, payload, message_id, route, routing_key, settle, body, properties)
        self._queued.append(item)
        self._queued_bytes += len(payload)
        if self._queued_bytes >= _WRITE_BYTES:
            self._flush()  # now: the next publish waits for this write to drain
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return None

    async def close(self) -> None:
        """Wait for outstanding confirms (up to ``close_timeout``), then disconnect."""
        await self.close_within(self._close_timeout)

    async def close_within(self, seconds: float) -> None:
        """``close``, returning within ``seconds`` (and ``close_timeout``) whatever the broker
        does: a stopping worker passes what is left of its stop budget. A broker that does not
        answer the connection's close in time is left behind (the socket goes with the
        process); what is still unconfirmed fails as "will be sent again"."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + max(min(seconds, self._close_timeout), 0.0)
        self._flush()
        pending = list(self._outstanding)
        if pending:
            _, late = await asyncio.wait(pending, timeout=max(deadline - time.monotonic(), 0))
            if late:
                logger.warning(
                    "RabbitMQ transport %s closes with %s unconfirmed messages; they are sent "
                    "again by the next owner",
                    self._name,
                    len(late),
                    extra={"action": "transport_close", "rows": len(late)},
                )
        closing = asyncio.ensure_future(self._disconnect_locked())
        done, _ = await asyncio.wait({closing}, timeout=max(deadline - time.monotonic(), 0))
        if not done:
            # The first cancellation ends aiormq's wait for the broker's Close-Ok, a second
            # one its wait for the socket to flush (a blocked broker may never read it).
            for _ in range(2):
                closing.cancel()
                done, _ = await asyncio.wait({closing}, timeout=0.05)
                if done:
                    break
            logger.debug("RabbitMQ transport %s: the broker did not answer the close", self._name)
        closed = TransportUnavailableError(
            f"RabbitMQ transport {self._name!r} closed before the broker confirmed the message; "
            "it will be sent again"
        )
        for future in pending:
            if not future.done():
                future.set_exception(closed)
                future.exception()  # retrieved: whoever gave up on it is not warned at exit

    async def _disconnect_locked(self) -> None:
        async with self._connect_lock:  # not while a reconnect is half done
            await self._disconnect()

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
        1 MiB (the fast path), or hand each to aiormq's basic_publish (the public path).

        Only this transport writes on its publishing channel, so numbering the messages here
        (with no await in between) numbers them exactly as the broker will; the confirm
        tracking settles them from the broker's acks, nacks and returns, and fails them all if
        the channel or connection is lost.
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
        confirms = self._confirms
        for item in queued:
            if not usable or item.underlay is not underlay:
                lost = _lost(item.route, ConnectionError("channel closed"))
                self._settle_unwritten(item, lost)
                continue
            if item.message_id in getattr(underlay, "message_id_delivery_tag", ()):
                # A basic.return names the message by its id: with two copies unconfirmed, a
                # return could fail the wrong one. The earlier copy settles first; this one is
                # the broker's delay, not the row's fault (no attempt is counted).
                self._notice.refused(self._unconfirmed, self._confirmed_at)
                self._settle_unwritten(item, _still_unconfirmed(item.message_id))
                continue
            if confirms is None or item.properties is not None:
                self._publish_public(underlay, item)
                continue
            confirms.track(item.message_id, functools.partial(self._settle, item))
            payloads.append(item.payload)
            size += len(item.payload)
            if size >= _WRITE_BYTES:  # large messages: several writes, not one huge copy
                writes.append(b"".join(payloads))
                payloads, size = [], 0
        if payloads:
            writes.append(b"".join(payloads))
        if not writes:
            return
        # The writer resolves this once the turn's last write has left the socket buffer; aiormq
        # fails it when the connection is lost, and publishes only wait for it (asyncio.wait
        # does not retrieve an exception): retrieve it, or asyncio reports each lost write.
        self._drained = underlay.create_future()
        self._drained.add_done_callback(_retrieve)
        self._frames.extend(frames.write(writes, self._drained))
        self._write_frames(underlay)

    def _publish_public(self, underlay: Any, item: _Queued) -> None:
        """The public path: aiormq's basic_publish, one task per message, written in order
        (the channel's lock is fair) and settled by its confirmation."""

        async def publish() -> None:
            try:
                await underlay.basic_publish(
                    item.body,
                    exchange=item.route.exchange,
                    routing_key=item.routing_key,
                    properties=item.properties,
                    mandatory=True,
                )
            except BaseException as exc:
                self._settle(item, exc if isinstance(exc, Exception) else ConnectionError(exc))
                if not isinstance(exc, Exception):
                    raise
            else:
                self._settle(item, None)

        task = asyncio.get_running_loop().create_task(publish())
        self._fallback_tasks.add(task)
        task.add_done_callback(self._fallback_tasks.discard)

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

    def _settle(self, item: _Queued, error: BaseException | None) -> None:
        """The broker's answer for one message, as the relay understands it."""
        self._release_room()
        if error is None:
            item.settle(None)
            self._confirmed_at = time.monotonic()
            if self._notice.since is not None:
                self._notice.acknowledged()
            return
        route, routing_key = item.route, item.routing_key
        if isinstance(error, aiormq.exceptions.PublishError):
            item.settle(SendError(_unroutable(route, routing_key, error), retryable=False))
        elif isinstance(error, aiormq.exceptions.DeliveryError):
            item.settle(
                SendError(
                    f"RabbitMQ refused (nack) a message for {route.destination!r}: the queue "
                    "may be full with overflow=reject-publish; the message will be retried"
                )
            )
        elif isinstance(error, aiormq.exceptions.ChannelNotFoundEntity):
            # The broker closed the channel (an exchange was deleted): every outstanding
            # confirm on it fails. The next publish re-checks the exchange on a new channel.
            self._exchanges.clear()
            item.settle(
                TransportUnavailableError(
                    f"RabbitMQ closed the publishing channel ({redact(str(error))}) before it "
                    f"confirmed a message for {route.destination!r}; it will be sent again"
                )
            )
        else:  # a lost channel/connection fails every outstanding confirm
            item.settle(_lost(route, error))

    def _settle_unwritten(self, item: _Queued, error: Exception) -> None:
        """A queued publish that is not written: its room back, ``error`` to the relay."""
        self._release_room()
        item.settle(error)

    def _release_room(self) -> None:
        self._unconfirmed -= 1
        if self._unconfirmed < self._max_outstanding:
            self._room.set()

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
                self._use_path(underlay)
                self._underlay = underlay
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

    def _use_path(self, underlay: Any) -> None:
        """Write on ``underlay`` through the fast path if this aiormq is one it was tested
        with, else through aiormq's public basic_publish (said once per transport)."""
        problem = frames.fast_path_problem(underlay)
        if problem is None:
            self._encoder = frames.Encoder(underlay.number, underlay.max_content_size)
            self._confirms = frames.Confirms(underlay)
            return
        self._encoder = None
        self._confirms = None
        if not self._warned_path:
            self._warned_path = True
            logger.warning(
                "RabbitMQ transport %s publishes through aiormq's basic_publish, several times "
                "slower: %s; install a tested aiormq (pip install 'aiormq>=7.2,<7.3') for the "
                "fast path",
                self._name,
                problem,
                extra={"action": "transport_slow_path"},
            )

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


@dataclass(slots=True)
class _Queued:
    """An encoded publish waiting for this event-loop turn's write (``payload``; on the public
    path the body and properties instead), and who to tell its outcome."""

    underlay: Any
    payload: bytes
    message_id: str
    route: Route
    routing_key: str
    settle: _Settle
    body: bytes
    properties: spec.Basic.Properties | None


def _still_unconfirmed(message_id: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"an earlier copy of message {message_id} is still waiting for RabbitMQ's confirm "
        "(the broker is slow to confirm or stalled); this copy will be sent again after it"
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


def _settle_future(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        fail_quietly(future, error)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


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
