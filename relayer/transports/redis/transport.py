"""RedisTransport: its options, start (with the server's capabilities), the two ways to
publish (both through ``_enqueue``) and close; the XADDs are relayer.transports.redis.writer's.
The package's docstring says what the transport guarantees."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from relayer.errors import TransportError
from relayer.redact import redact
from relayer.transports.base import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    DestinationError,
    SendError,
    TransportUnavailableError,
)
from relayer.transports.options import Options, TransportOptionError
from relayer.transports.publishing import Outcome, QueuingTransport
from relayer.transports.redis import outcomes
from relayer.transports.redis.writer import StreamWriter
from relayer.transports.stalls import StallNotice

# The package's name: every part of the transport logs as one (users filter on it).
logger = logging.getLogger("relayer.transports.redis")

BODY_FIELD = "body"
# The application's header NAME travels as the field "header:NAME".
HEADER_FIELD_PREFIX = "header:"

_KNOWN_OPTIONS = (
    "url, maxlen, create_streams, max_outstanding, connect_timeout, socket_timeout, close_timeout"
)


class RedisTransport(QueuingTransport):
    """Appends to Redis streams with XADD and waits for each entry's id."""

    # OpenTelemetry's messaging.system for the relay's send spans (relayer.relay.trace).
    messaging_system = "redis"

    def __init__(
        self,
        name: str,
        url: str,
        *,
        maxlen: int | None = None,
        create_streams: bool = True,
        max_outstanding: int = 5_000,
        connect_timeout: float = 10.0,
        socket_timeout: float = 30.0,
        close_timeout: float = 30.0,
    ) -> None:
        super().__init__(name, close_timeout)
        self._url = url
        self.shown_url = redact(url)
        self._create_streams = create_streams
        self._connect_timeout = connect_timeout
        self._socket_timeout = socket_timeout
        notice = StallNotice(
            logger, name, "Redis", "check the server (redis-cli ping) and the network"
        )
        self._writer = StreamWriter(
            maxlen=maxlen,
            create_streams=create_streams,
            max_outstanding=max_outstanding,
            notice=notice,
        )
        self._client: Any = None
        self._closed = False

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> RedisTransport:
        """The ``redis`` factory: options as in ``[stores.X.transports.Y]``."""
        reader = Options(options)
        url = reader.text("url")
        if not url:
            raise TransportOptionError(
                "url", url, "is required: redis://user:password@host:6379/0 (or rediss://, unix://)"
            )
        if not url.lower().startswith(("redis://", "rediss://", "unix://")):
            raise TransportOptionError("url", url, "must start with redis://, rediss:// or unix://")
        maxlen = reader.integer("maxlen", 0, low=0)
        transport = cls(
            name,
            url,
            maxlen=maxlen or None,
            create_streams=reader.flag("create_streams", True),
            max_outstanding=reader.integer("max_outstanding", 5_000, low=1),
            connect_timeout=reader.seconds("connect_timeout", 10.0),
            socket_timeout=reader.seconds("socket_timeout", 30.0),
            close_timeout=reader.seconds("close_timeout", 30.0),
        )
        reader.reject_unread("redis", _KNOWN_OPTIONS)
        return transport

    def __repr__(self) -> str:
        return f"RedisTransport(name={self._name!r}, url={self.shown_url!r})"

    async def start(self) -> None:
        """Connect and check that the server has streams (Redis 5.0; NOMKSTREAM, for
        ``create_streams = false``, 6.2): TransportUnavailableError if it does not answer
        within ``connect_timeout``, TransportError if it lacks what is needed."""
        self._closed = False
        client = redis.asyncio.Redis.from_url(
            self._url,
            socket_connect_timeout=self._connect_timeout,
            socket_timeout=self._socket_timeout,
            # No retries inside the client: a failed XADD goes back to the relay, which sends
            # the row again (a retried pipeline could append it twice for nothing).
            retry=Retry(NoBackoff(), 0),
        )
        try:
            info = await asyncio.wait_for(client.info("server"), self._connect_timeout)
        except Exception as exc:
            await _abandon(client)
            raise TransportUnavailableError(
                f"cannot connect Redis transport {self._name!r} to {self.shown_url}: "
                f"{type(exc).__name__}: {redact(str(exc))}; check the url, credentials and "
                "that the server runs"
            ) from exc
        problem = _capability_problem(str(info.get("redis_version", "0")), self._create_streams)
        if problem is not None:
            await _abandon(client)
            raise TransportError(f"Redis transport {self._name!r}: {problem}")
        self._client = self._writer.client = client
        logger.info(
            "Redis transport %s connected to %s (Redis %s)",
            self._name,
            self.shown_url,
            info.get("redis_version"),
            extra={"action": "transport_start"},
        )

    async def ordered_by_key(self, destination: str) -> bool:
        """True for a stream (an XADD appends in order), or a key not there yet when streams
        are created; DestinationError for a key of another type."""
        if not destination:
            raise DestinationError("the destination is empty; name the Redis stream to add to")
        client = self._usable()
        try:
            kind = await client.type(destination)
        except Exception as exc:  # a connection problem, not a property of the key
            raise outcomes.unavailable(destination, exc) from exc
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        if kind == "stream":
            return True
        if kind != "none":
            raise DestinationError(outcomes.wrong_type(destination, f"a {kind}"))
        if not self._create_streams:
            raise DestinationError(outcomes.missing_stream(destination))
        return True

    def _must_wait(self) -> bool:
        return self._writer.full()

    async def _enqueue(
        self,
        stream: str,
        *,
        key: str | None,
        message_id: str,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        settle: Outcome,
    ) -> Exception | None:
        """Queue one XADD for this turn's pipeline; the error if it fails at once. Raises
        TransportError when the transport cannot be used."""
        self._usable()
        if not stream:
            return SendError("the destination is empty; name the Redis stream", retryable=False)
        fields: dict[str, bytes | str] = {BODY_FIELD: body, MESSAGE_ID_HEADER: message_id}
        if key is not None:
            fields[ORDERING_KEY_HEADER] = key
        if extra_headers:
            for name, value in extra_headers.items():
                fields[HEADER_FIELD_PREFIX + name] = value
        if self._writer.full():
            await self._writer.room()
            self._usable()
        copy = self._writer.refuse_copy(message_id)
        if copy is not None:
            return copy
        self._writer.queue(stream, message_id, fields, settle)
        return None

    def _usable(self) -> Any:
        if self._closed or self._client is None:
            raise TransportError(
                f"Redis transport {self._name!r} is "
                f"{'closed' if self._closed else 'not started'}; call start() before publish()"
            )
        return self._client

    async def close_within(self, seconds: float) -> None:
        """``close``, returning within ``seconds`` (and ``close_timeout``) whatever the server
        does; what is still unanswered then fails as "will be sent again"."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + max(min(seconds, self._close_timeout), 0.0)
        self._writer.flush()
        late = await self._writer.settled(deadline - time.monotonic())
        if late:
            logger.warning(
                "Redis transport %s closes with %s unanswered messages; they are sent again by "
                "the next owner",
                self._name,
                late,
                extra={"action": "transport_close", "rows": late},
            )
        await self._writer.abandon(
            TransportUnavailableError(
                f"Redis transport {self._name!r} closed before the server answered; the "
                "message will be sent again"
            )
        )
        client, self._client, self._writer.client = self._client, None, None
        if client is not None:
            await _abandon(client, max(deadline - time.monotonic(), 0.05))


def _capability_problem(version: str, create_streams: bool) -> str | None:
    try:
        numbers = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return None  # a fork that words its version otherwise: XADD will tell
    if numbers < (5, 0):
        return f"Redis {version} has no streams (5.0 or later needed); upgrade the server"
    if not create_streams and numbers < (6, 2):
        return (
            f"Redis {version} cannot refuse to create a stream (NOMKSTREAM: 6.2 or later); "
            "upgrade the server or set create_streams = true"
        )
    return None


async def _abandon(client: Any, seconds: float = 1.0) -> None:
    """Close ``client``'s connections within ``seconds``."""
    closing = asyncio.ensure_future(client.aclose())
    done, _ = await asyncio.wait({closing}, timeout=seconds)
    if not done:
        closing.cancel()
        await asyncio.wait({closing}, timeout=0.1)
        logger.debug("Redis: closing the connections did not finish in time")
    elif not closing.cancelled() and closing.exception() is not None:
        logger.debug("closing the Redis connections failed: %s", closing.exception())
