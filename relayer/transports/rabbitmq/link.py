"""The RabbitMQ transport's connection and its one publishing channel.

Connections are plain, not robust (the package's docstring says why): when one is lost, the
next publish reconnects, at most once per ``reconnect_interval`` (a publish in between fails at
once with the last reason).

A new channel is written through the fast path of relayer.transports.rabbitmq.frames when
this aiormq is one that path was tested with, else through aiormq's public ``basic_publish``.
Queues and exchanges are checked with passive declares on throw-away channels (a failed one
closes its channel).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import aio_pika
import aiormq

from relayer.errors import TransportError
from relayer.observability.throttle import ThrottledLog, shape
from relayer.redact import redact
from relayer.transports.base import TransportUnavailableError
from relayer.transports.rabbitmq import frames
from relayer.transports.rabbitmq.routes import Route

# The package's name: every part of the transport logs as one (users filter on it).
logger = logging.getLogger("relayer.transports.rabbitmq")


class Link:
    """The connection and publishing channel of one transport, opened again when lost.

    ``underlay`` is the current channel's aiormq channel (None while there is none), written
    with ``encoder`` and ``confirms`` on the fast path (both None on the public path).
    ``exchanges`` are those checked to exist on this channel. ``closed``: no more connecting.
    """

    def __init__(
        self,
        name: str,
        url: str,
        *,
        connect_timeout: float,
        reconnect_interval: float,
        on_disconnect: Callable[[], None],
    ) -> None:
        """``on_disconnect``: called whenever the connection is let go, to drop what was
        waiting to be written on it."""
        self._name = name
        self._url = url
        self.shown_url = redact(url)
        self._connect_timeout = connect_timeout
        self._reconnect_interval = reconnect_interval
        self._on_disconnect = on_disconnect
        self.connection: Any = None
        self._channel: Any = None
        self.underlay: Any = None
        self.encoder: frames.Encoder | None = None
        self.confirms: frames.Confirms | None = None
        self.exchanges: set[str] = set()
        self.closed = False
        self._warned_path = False
        self._lock = asyncio.Lock()
        self._last_failure: tuple[float, str] | None = None
        # A connection lost again and again (a flapping network) is one line per interval.
        self.log = ThrottledLog(logger)

    @property
    def open_underlay(self) -> Any:
        """The publishing channel if it is open, else None (then ``ensure_channel``)."""
        if self.underlay is not None and not self._channel.is_closed:
            return self.underlay
        return None

    async def ensure_channel(self, *, force: bool) -> Any:
        """The publishing channel, reconnecting when it or its connection was lost."""
        if self.underlay is not None and not self._channel.is_closed:
            return self.underlay
        async with self._lock:
            if self.closed:
                raise TransportError(f"RabbitMQ transport {self._name!r} is closed")
            if self.underlay is not None and not self._channel.is_closed:
                return self.underlay
            if not force and self._last_failure is not None:
                since, reason = self._last_failure
                if time.monotonic() - since < self._reconnect_interval:
                    raise TransportUnavailableError(reason)
            # A lost channel usually means a lost connection (whose object may not know it
            # yet): start over with both.
            await self.disconnect()
            await self._connect()
            if self.closed:  # close() was called while connecting
                await self.disconnect()
                raise TransportError(f"RabbitMQ transport {self._name!r} is closed")
            self._last_failure = None
            self.exchanges.clear()
            logger.debug(
                "RabbitMQ transport %s opened a publishing channel",
                self._name,
                extra={"action": "transport_connect"},
            )
            return self.underlay

    async def _connect(self) -> None:
        try:
            if self.connection is None:
                self.connection = await aio_pika.connect(
                    self._url,
                    timeout=self._connect_timeout,
                    client_properties={"connection_name": f"relayer {self._name}"},
                )
                self.connection.close_callbacks.add(self._lost)
            self._channel = await self.connection.channel(
                publisher_confirms=True, on_return_raises=True
            )
            underlay = await self._channel.get_underlay_channel()
            self._use_path(underlay)
            self.underlay = underlay
        except Exception as exc:  # every connect failure becomes one clear message
            reason = (
                f"cannot connect RabbitMQ transport {self._name!r} to {self.shown_url}: "
                f"{type(exc).__name__}: {redact(str(exc))}; check the url, credentials "
                "and that the broker runs"
            )
            self._last_failure = (time.monotonic(), reason)
            await self.disconnect()
            raise TransportUnavailableError(reason) from exc

    def _lost(self, connection: Any, exc: BaseException | None) -> None:
        """The broker or the network ended the connection (not this transport: ``disconnect``
        lets go of it first). Said even when no publish was waiting on it, as the rows that
        were waiting are (relayer.relay.outcomes): aiormq's own warnings are not shown."""
        if self.closed or connection is not self.connection:
            return
        reason = f"{type(exc).__name__}: {redact(str(exc))}" if exc is not None else "closed"
        self.log.warning(
            ("lost", shape(reason)),
            "RabbitMQ transport %s lost its connection to %s (%s); rows wait and no attempt "
            "is counted, it reconnects at the next publish (at most every %.1f s); check the "
            "broker and the network if it lasts",
            self._name,
            self.shown_url,
            reason,
            self._reconnect_interval,
            extra={"action": "transport_unavailable"},
        )

    def _use_path(self, underlay: Any) -> None:
        """Write on ``underlay`` through the fast path if this aiormq is one it was tested
        with, else through aiormq's public basic_publish (said once per transport)."""
        problem = frames.fast_path_problem(underlay)
        if problem is None:
            self.encoder = frames.Encoder(underlay.number, underlay.max_content_size)
            self.confirms = frames.Confirms(underlay)
            return
        self.encoder = None
        self.confirms = None
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

    async def check_exists(self, route: Route) -> str | None:
        """Passive-declare the route's queue or exchange on a throw-away channel: None if it
        exists, else what is wrong and what to do.

        A failed passive declare closes its channel, so never on the publishing one.
        """
        assert self.connection is not None
        try:
            async with self.connection.channel(publisher_confirms=False) as channel:
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
            self.exchanges.add(route.exchange)
        return None

    async def disconnect(self) -> None:
        connection, self.connection = self.connection, None
        self._channel = self.underlay = None
        self._on_disconnect()
        if connection is not None and not connection.is_closed:
            try:
                await connection.close()
            except Exception as exc:  # closing a broken connection may fail; it is gone anyway
                logger.debug("closing the RabbitMQ connection failed: %s", redact(str(exc)))

    async def disconnect_locked(self) -> None:
        async with self._lock:  # not while a reconnect is half done
            await self.disconnect()
