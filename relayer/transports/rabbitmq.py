"""RabbitMQ through aio-pika: publisher confirms, mandatory routing, pipelined on one channel.

Options: ``url`` (required, ``amqp://user:password@host:5672/vhost`` or ``amqps://...``),
``ordered_destinations`` (destinations or exchange names the operator declares per-key ordered,
see below), ``max_outstanding`` (unconfirmed publishes before ``publish`` waits, default
5,000), ``connect_timeout``, ``close_timeout`` and ``reconnect_interval`` (seconds).
Destinations are described in ``rabbitmq_routes``.

Every message is persistent, published with ``mandatory=True`` (an unroutable message fails
with a non-retryable SendError instead of being dropped), carries the outbox id as AMQP
``message_id`` and in the ``relayer-message-id`` header, and the ordering key in the
``relayer-ordering-key`` header. Publishes are written on one channel in call order and many
confirms may be outstanding. RabbitMQ has no gapless guarantee, so ``pipelines_within_key`` is
False: the relay waits for a key's confirm before publishing its next row.

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
import logging
import time
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any

import aio_pika
import aiormq
from aiormq import spec

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
        self._outstanding: set[asyncio.Task[None]] = set()
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
        try:
            await self._ensure_channel(force=True)
            problem = await self._check_exists(route)
        except TransportUnavailableError as exc:
            raise DestinationError(str(exc)) from exc
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
        headers: dict[str, Any] = dict(message.headers) if message.headers else {}
        for name in headers:
            if len(name.encode()) > _MAX_HEADER_NAME_BYTES:
                return _failed(SendError(_long_header_name(name), retryable=False))
        headers[MESSAGE_ID_HEADER] = message.id_text
        if message.key is not None:
            headers[ORDERING_KEY_HEADER] = message.key
        properties = spec.Basic.Properties(
            delivery_mode=_PERSISTENT, message_id=message.id_text, headers=headers
        )
        await self._slots.acquire()
        # aiormq's publish coroutine awaits its own confirm, so pipelining needs a task per
        # message; tasks start in creation order and take the channel lock in that order.
        task = asyncio.get_running_loop().create_task(
            self._send(underlay, route, routing_key, message.body, properties)
        )
        self._outstanding.add(task)
        task.add_done_callback(self._outstanding.discard)
        return task

    async def close(self) -> None:
        """Wait for outstanding confirms (up to ``close_timeout``), then disconnect."""
        if self._closed:
            return
        self._closed = True
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

    async def _send(
        self,
        underlay: Any,
        route: Route,
        routing_key: str,
        body: bytes,
        properties: spec.Basic.Properties,
    ) -> None:
        try:
            await underlay.basic_publish(
                body,
                exchange=route.exchange,
                routing_key=routing_key,
                properties=properties,
                mandatory=True,
            )
        except aiormq.exceptions.PublishError as exc:
            raise SendError(_unroutable(route, routing_key, exc), retryable=False) from exc
        except aiormq.exceptions.DeliveryError as exc:
            raise SendError(
                f"RabbitMQ refused (nack) a message for {route.destination!r}: the queue may "
                "be full with overflow=reject-publish; the message will be retried"
            ) from exc
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            # The broker closed the channel (an exchange was deleted): every outstanding
            # confirm on it fails. The next publish re-checks the exchange on a new channel.
            self._exchanges.clear()
            raise TransportUnavailableError(
                f"RabbitMQ closed the publishing channel ({redact(str(exc))}) before it "
                f"confirmed a message for {route.destination!r}; it will be sent again"
            ) from exc
        except Exception as exc:  # a lost channel/connection fails every outstanding confirm
            raise TransportUnavailableError(
                f"RabbitMQ connection or channel lost before the broker confirmed a message "
                f"for {route.destination!r} ({type(exc).__name__}: {redact(str(exc))}); "
                "the message will be sent again"
            ) from exc
        finally:
            self._slots.release()

    async def _ensure_channel(self, *, force: bool) -> Any:
        """The publishing channel, reconnecting when it or its connection was lost."""
        if self._underlay is not None and not self._channel.is_closed:
            return self._underlay
        async with self._connect_lock:
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
                self._underlay = await self._channel.get_underlay_channel()
            except Exception as exc:  # every connect failure becomes one clear message
                reason = (
                    f"cannot connect RabbitMQ transport {self._name!r} to {self._shown_url}: "
                    f"{type(exc).__name__}: {redact(str(exc))}; check the url, credentials "
                    "and that the broker runs"
                )
                self._last_failure = (time.monotonic(), reason)
                await self._disconnect()
                raise TransportUnavailableError(reason) from exc
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
        if connection is not None and not connection.is_closed:
            try:
                await connection.close()
            except Exception as exc:  # closing a broken connection may fail; it is gone anyway
                logger.debug("closing the RabbitMQ connection failed: %s", redact(str(exc)))


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
