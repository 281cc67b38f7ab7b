"""RabbitMQTransport: its options, start, the two ways to publish (both through one path,
``_enqueue``) and close; the connection is relayer.transports.rabbitmq.link's, the writes and
confirms relayer.transports.rabbitmq.writer's. The package's docstring says what the transport
guarantees."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from relayer.errors import TransportError
from relayer.transports.base import (
    DestinationError,
    OutboundBatch,
    OutgoingMessage,
    SendError,
    Settle,
    TransportUnavailableError,
    fail_quietly,
)
from relayer.transports.options import Options, TransportOptionError
from relayer.transports.rabbitmq.link import Link
from relayer.transports.rabbitmq.routes import Route, RouteError, parse_route
from relayer.transports.rabbitmq.writer import ChannelWriter, Outcome
from relayer.transports.stalls import StallNotice

# The package's name: every part of the transport logs as one (users filter on it).
logger = logging.getLogger("relayer.transports.rabbitmq")

_KNOWN_OPTIONS = (
    "url, ordered_destinations, max_outstanding, connect_timeout, close_timeout, reconnect_interval"
)


class RabbitMQTransport:
    """Publishes to RabbitMQ exchanges and queues with publisher confirms."""

    # OpenTelemetry's messaging.system for the relay's send spans (relayer.relay.trace).
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
        self._ordered = frozenset(ordered_destinations)
        self._close_timeout = close_timeout
        notice = StallNotice(
            logger,
            name,
            "RabbitMQ",
            "check the broker's alarms (rabbitmqctl status) and the network",
        )
        self._link = Link(
            name,
            url,
            connect_timeout=connect_timeout,
            reconnect_interval=reconnect_interval,
            on_disconnect=self._drop_unwritten,
        )
        self._writer = ChannelWriter(self._link, max_outstanding=max_outstanding, notice=notice)
        self._routes: dict[str, Route | str] = {}
        self._outstanding: set[asyncio.Future[None]] = set()  # publish()'s awaitables
        self._started = False

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
        return f"RabbitMQTransport(name={self._name!r}, url={self._link.shown_url!r})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def pipelines_within_key(self) -> bool:
        return False

    async def start(self) -> None:
        self._started = True
        self._link.closed = False
        await self._link.ensure_channel(force=True)
        logger.info(
            "RabbitMQ transport %s connected to %s",
            self._name,
            self._link.shown_url,
            extra={"action": "transport_start"},
        )

    async def ordered_by_key(self, destination: str) -> bool:
        """True for a queue that exists, or an existing exchange the operator listed."""
        route = self._route(destination)
        if isinstance(route, str):
            raise DestinationError(route)
        await self._link.ensure_channel(force=True)  # unreachable: TransportUnavailableError
        problem = await self._link.check_exists(route)
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
            if handed and self._writer.must_wait() and not admitting():
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

    async def _enqueue(
        self,
        destination: str,
        *,
        key: str | None,
        message_id: str,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        settle: Outcome,
    ) -> SendError | None:
        """Queue one publish for this turn's write; the error if it fails at once (SendError).
        Raises TransportError when the transport cannot be used (closed, unreachable)."""
        if not self._started or self._link.closed:
            raise TransportError(
                f"RabbitMQ transport {self._name!r} is "
                f"{'closed' if self._link.closed else 'not started'}; call start() before "
                "publish()"
            )
        link = self._link
        route = self._route(destination)
        try:
            if isinstance(route, str):
                return SendError(route, retryable=False)
            routing_key = route.routing_key_for(key)
            underlay = link.open_underlay  # the usual case, without a coroutine a message
            if underlay is None:
                underlay = await link.ensure_channel(force=False)
            if route.exchange and route.exchange not in link.exchanges:
                problem = await link.check_exists(route)
                if problem is not None:
                    return SendError(problem, retryable=False)
                underlay = await link.ensure_channel(force=False)
        except RouteError as exc:
            return SendError(str(exc), retryable=False)
        return await self._writer.publish(
            underlay,
            route,
            routing_key,
            key=key,
            message_id=message_id,
            body=body,
            extra_headers=extra_headers,
            settle=settle,
        )

    async def close(self) -> None:
        """Wait for outstanding confirms (up to ``close_timeout``), then disconnect."""
        await self.close_within(self._close_timeout)

    async def close_within(self, seconds: float) -> None:
        """``close``, returning within ``seconds`` (and ``close_timeout``) whatever the broker
        does: a stopping worker passes what is left of its stop budget. A broker that does not
        answer the connection's close in time is left behind (the socket goes with the
        process); what is still unconfirmed fails as "will be sent again"."""
        if self._link.closed:
            return
        self._link.closed = True
        self._link.log.flush()  # the held-back count of lost connections, if any
        deadline = time.monotonic() + max(min(seconds, self._close_timeout), 0.0)
        self._writer.flush()
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
        closing = asyncio.ensure_future(self._link.disconnect_locked())
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

    def _drop_unwritten(self) -> None:
        """The link lets its connection go: what was not written on it goes too."""
        self._writer.drop_unwritten()


def _settle_future(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        fail_quietly(future, error)
