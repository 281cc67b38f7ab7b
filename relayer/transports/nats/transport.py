"""NatsTransport: its options, start, the two ways to publish (both through ``_enqueue``), the
acknowledgements it waits for, and close. The package's docstring says what it guarantees."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from relayer.errors import TransportError
from relayer.observability.throttle import ThrottledLog
from relayer.redact import redact
from relayer.transports.base import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    DestinationError,
    SendError,
    TransportUnavailableError,
)
from relayer.transports.nats import outcomes
from relayer.transports.nats.acks import Acknowledgements
from relayer.transports.options import Options, TransportOptionError
from relayer.transports.publishing import Outcome, QueuingTransport
from relayer.transports.stalls import StallNotice

# The package's name: every part of the transport logs as one (users filter on it).
logger = logging.getLogger("relayer.transports.nats")

# JetStream drops a message whose Nats-Msg-Id it stored within the stream's duplicate window.
DEDUPLICATION_HEADER = "Nats-Msg-Id"

# nats://TOKEN@host: the userinfo without a colon is a token (with one: user and password).
_TOKEN = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^:/@\s]+@")

_KNOWN_OPTIONS = (
    "url, max_outstanding, connect_timeout, close_timeout, reconnect_interval, ack_timeout, "
    "ping_interval"
)


class NatsTransport(QueuingTransport):
    """Publishes to NATS JetStream subjects and waits for each message's acknowledgement."""

    # OpenTelemetry's messaging.system for the relay's send spans (relayer.relay.trace).
    messaging_system = "nats"

    def __init__(
        self,
        name: str,
        url: str,
        *,
        max_outstanding: int = 5_000,
        connect_timeout: float = 10.0,
        close_timeout: float = 30.0,
        reconnect_interval: float = 1.0,
        ack_timeout: float = 30.0,
        ping_interval: float = 20.0,
    ) -> None:
        super().__init__(name, close_timeout)
        self._servers = [server.strip() for server in url.split(",") if server.strip()]
        self.shown_url = shown(url)
        self._connect_timeout = connect_timeout
        self._reconnect_interval = reconnect_interval
        self._ack_timeout = ack_timeout
        self._ping_interval = ping_interval
        notice = StallNotice(
            logger, name, "NATS", "check the server (nats server check jetstream) and the network"
        )
        self._acks = Acknowledgements(max_outstanding, notice)
        self._log = ThrottledLog(logger)
        self._connection: NATS | None = None
        self._jetstream: JetStreamContext | None = None
        self._subjects: dict[str, str | None] = {}  # subject -> what is wrong with it
        self._watchdog: asyncio.Task[None] | None = None
        self._last_error: Exception | None = None
        self._closed = False

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> NatsTransport:
        """The ``nats`` factory: options as in ``[stores.X.transports.Y]``."""
        reader = Options(options)
        url = reader.text("url")
        if not url:
            raise TransportOptionError(
                "url", url, "is required: nats://host:4222 (or tls://, several separated by commas)"
            )
        for server in url.split(","):
            if not server.strip().lower().startswith(("nats://", "tls://", "ws://", "wss://")):
                raise TransportOptionError(
                    "url",
                    shown(url),
                    "must be nats://, tls://, ws:// or wss:// URLs, comma-separated",
                )
        transport = cls(
            name,
            url,
            max_outstanding=reader.integer("max_outstanding", 5_000, low=1),
            connect_timeout=reader.seconds("connect_timeout", 10.0),
            close_timeout=reader.seconds("close_timeout", 30.0),
            reconnect_interval=reader.seconds("reconnect_interval", 1.0),
            ack_timeout=reader.seconds("ack_timeout", 30.0),
            ping_interval=reader.seconds("ping_interval", 20.0),
        )
        reader.reject_unread("nats", _KNOWN_OPTIONS)
        return transport

    def __repr__(self) -> str:
        return f"NatsTransport(name={self._name!r}, url={self.shown_url!r})"

    async def start(self) -> None:
        """Connect and check that JetStream answers (TransportUnavailableError if the server
        or its JetStream does not within ``connect_timeout``); from then on nats-py reconnects
        by itself whenever the connection is lost."""
        self._closed = False
        self._last_error = None
        connection = NATS()
        # nats-py annotates these as int but uses them as any number of seconds.
        timing: dict[str, Any] = {
            "connect_timeout": self._connect_timeout,
            "reconnect_time_wait": self._reconnect_interval,
            "ping_interval": self._ping_interval,
        }
        try:
            await asyncio.wait_for(
                connection.connect(
                    servers=self._servers,
                    name=f"relayer {self._name}",
                    max_reconnect_attempts=-1,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected,
                    **timing,
                ),
                self._connect_timeout,
            )
        except Exception as exc:
            await _abandon(connection)
            reason = self._last_error or exc
            raise TransportUnavailableError(
                f"cannot connect NATS transport {self._name!r} to {self.shown_url}: "
                f"{type(reason).__name__}: {shown(str(reason))}; check the url, credentials "
                "and that the server runs"
            ) from exc
        jetstream = connection.jetstream()
        try:
            await self._acks.listen(connection)
            await asyncio.wait_for(jetstream.account_info(), self._connect_timeout)
        except Exception as exc:
            await _abandon(connection)
            raise TransportUnavailableError(
                f"NATS transport {self._name!r}: JetStream does not answer at {self.shown_url} "
                f"({type(exc).__name__}: {shown(str(exc))}); enable JetStream on the server "
                "(nats-server -js, or jetstream {} in its configuration) and for the account"
            ) from exc
        self._connection = connection
        self._jetstream = jetstream
        self._watchdog = asyncio.get_running_loop().create_task(self._watch_acknowledgements())
        logger.info(
            "NATS transport %s connected to %s",
            self._name,
            self.shown_url,
            extra={"action": "transport_start"},
        )

    async def ordered_by_key(self, destination: str) -> bool:
        """True when a JetStream stream captures the subject (a stream stores what it gets in
        order); DestinationError when none does."""
        problem = self._subject_problem(destination)
        if problem is not None:
            raise DestinationError(problem)
        self._usable()
        assert self._jetstream is not None
        try:
            await self._jetstream.find_stream_name_by_subject(destination)
        except nats.js.errors.NotFoundError as exc:
            raise DestinationError(outcomes.no_stream(destination)) from exc
        except Exception as exc:  # a connection problem, not a property of the subject
            raise TransportUnavailableError(
                f"cannot look up the JetStream stream of subject {destination!r}: "
                f"{type(exc).__name__}: {shown(str(exc))}"
            ) from exc
        return True

    def _must_wait(self) -> bool:
        return self._acks.full()

    async def _enqueue(
        self,
        subject: str,
        *,
        key: str | None,
        message_id: str,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        settle: Outcome,
    ) -> Exception | None:
        """Publish one message, its acknowledgement awaited in the background; the error if
        it fails at once. Raises TransportError when the transport cannot be used."""
        connection = self._usable()
        problem = self._subject_problem(subject)
        if problem is not None:
            return SendError(problem, retryable=False)
        headers: dict[str, str] = dict(extra_headers) if extra_headers else {}
        refusal = outcomes.header_problem(headers)
        if refusal is not None:
            return refusal
        headers[MESSAGE_ID_HEADER] = message_id
        headers[DEDUPLICATION_HEADER] = message_id
        if key is not None:
            headers[ORDERING_KEY_HEADER] = key
        size = len(body) + sum(len(n) + len(v.encode()) + 4 for n, v in headers.items()) + 12
        if size > connection.max_payload:
            return outcomes.too_large(subject, size, connection.max_payload)
        if self._acks.full():
            await self._acks.room()
            connection = self._usable()
        copy = self._acks.refuse_copy(message_id)
        if copy is not None:
            return copy
        reply = self._acks.reply_subject(message_id, subject, settle)
        try:
            await connection.publish(subject, body, reply=reply, headers=headers)
        except (nats.errors.MaxPayloadError, nats.errors.BadSubjectError) as exc:
            self._acks.unsent(message_id)
            return outcomes.refused(exc, subject)
        except Exception as exc:  # closed, reconnecting, its buffer full: not the row's fault
            self._acks.unsent(message_id)
            raise outcomes.unavailable(subject, exc) from exc
        return None

    def _usable(self) -> NATS:
        connection = self._connection
        if self._closed or connection is None:
            raise TransportError(
                f"NATS transport {self._name!r} is "
                f"{'closed' if self._closed else 'not started'}; call start() before publish()"
            )
        if not connection.is_connected:
            raise TransportUnavailableError(
                f"NATS transport {self._name!r} is not connected to {self.shown_url} (it "
                "reconnects by itself); the rows will be sent once it is"
            )
        return connection

    def _subject_problem(self, subject: str) -> str | None:
        if subject in self._subjects:
            return self._subjects[subject]
        problem = outcomes.subject_problem(subject)
        if len(self._subjects) < 10_000:
            self._subjects[subject] = problem
        return problem

    async def _watch_acknowledgements(self) -> None:
        """Fail acknowledgements older than ``ack_timeout`` (their rows are sent again)."""
        while not self._closed:
            await asyncio.sleep(min(self._ack_timeout / 4, 1.0))
            late = self._acks.fail(
                outcomes.not_acknowledged_in_time(self._ack_timeout),
                older_than=self._ack_timeout,
            )
            if late:
                self._log.warning(
                    ("ack_timeout", self._name),
                    "NATS transport %s: %s message(s) were not acknowledged within %g s; their "
                    "rows are sent again; check the server (nats server check jetstream) and "
                    "the network",
                    self._name,
                    late,
                    self._ack_timeout,
                    extra={"action": "transport_ack_timeout"},
                )
            self._log.flush_due()

    async def _on_error(self, error: Exception) -> None:
        self._last_error = error
        if self._connection is None:
            return  # still starting: start() reports the last one if it fails
        self._log.warning(
            ("error", self._name, type(error).__name__),
            "NATS transport %s: %s: %s; the client reconnects by itself; check the url, "
            "credentials and the server",
            self._name,
            type(error).__name__,
            shown(str(error)),
            extra={"action": "transport_error"},
        )

    async def _on_disconnected(self) -> None:
        lost = self._acks.fail(outcomes.connection_lost(self.shown_url))
        if self._closed:
            return
        self._log.warning(
            ("disconnected", self._name),
            "NATS transport %s lost its connection to %s with %s message(s) unacknowledged; "
            "it reconnects by itself and their rows are sent again; check the server and the "
            "network",
            self._name,
            self.shown_url,
            lost,
            extra={"action": "transport_disconnected"},
        )

    async def _on_reconnected(self) -> None:
        logger.info(
            "NATS transport %s reconnected to %s",
            self._name,
            self.shown_url,
            extra={"action": "transport_connect"},
        )

    async def close_within(self, seconds: float) -> None:
        """``close``, returning within ``seconds`` (and ``close_timeout``) whatever the server
        does; what is still unacknowledged then fails as "will be sent again"."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + max(min(seconds, self._close_timeout), 0.0)
        late = await self._acks.settled(deadline - time.monotonic())
        if late:
            logger.warning(
                "NATS transport %s closes with %s unacknowledged messages; they are sent "
                "again by the next owner",
                self._name,
                late,
                extra={"action": "transport_close", "rows": late},
            )
        self._acks.fail(
            TransportUnavailableError(
                f"NATS transport {self._name!r} closed before JetStream acknowledged the "
                "message; it will be sent again"
            )
        )
        if self._watchdog is not None:
            self._watchdog.cancel()
        connection, self._connection, self._jetstream = self._connection, None, None
        if connection is not None:
            await _abandon(connection, max(deadline - time.monotonic(), 0.05))
        self._log.flush()


def shown(text: str) -> str:
    """``text`` (URLs, or an error that may quote one) fit to show: passwords masked, and
    tokens (``nats://TOKEN@host``: userinfo without a colon) too."""
    return _TOKEN.sub(r"\g<scheme>***@", redact(text))


async def _abandon(connection: NATS, seconds: float = 1.0) -> None:
    """Close ``connection`` within ``seconds``: a stalled server may never read the flush
    nats-py's close starts with; the socket then goes with the task."""
    closing = asyncio.ensure_future(connection.close())
    done, _ = await asyncio.wait({closing}, timeout=seconds)
    if not done:
        closing.cancel()
        await asyncio.wait({closing}, timeout=0.1)
        logger.debug("NATS: the server did not answer the close")
    elif not closing.cancelled() and closing.exception() is not None:
        logger.debug("closing the NATS connection failed: %s", closing.exception())
