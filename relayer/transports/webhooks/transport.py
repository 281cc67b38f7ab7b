"""WebhookTransport: its options, start, the two ways to publish (both through ``_hand``), the
request itself and close. The package's docstring says what the transport guarantees."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from relayer.errors import TransportError
from relayer.redact import redact
from relayer.transports.base import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    DestinationError,
    SendError,
)
from relayer.transports.gate import Gate
from relayer.transports.lifecycle import wait_then_abandon
from relayer.transports.options import Options, TransportOptionError
from relayer.transports.publishing import Outcome, QueuingTransport
from relayer.transports.stalls import StallNotice
from relayer.transports.webhooks import outcomes
from relayer.transports.webhooks.endpoints import DestinationProblem, Endpoints, Target
from relayer.transports.webhooks.signing import Signer

# The package's name: every part of the transport logs as one (users filter on it).
logger = logging.getLogger("relayer.transports.webhooks")

_KNOWN_OPTIONS = (
    "url, secret, max_concurrency, timeout, connect_timeout, close_timeout, content_type"
)
# An HTTP header name (RFC 9110 token); a value must not break the request's framing.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FRAMING = re.compile(r"[\r\n\x00]")
# Set by the transport (the signature covers the id and timestamp) or by the HTTP client.
_RESERVED = frozenset(
    {
        "webhook-id", "webhook-timestamp", "webhook-signature", "idempotency-key",
        "host", "content-length", "transfer-encoding", "connection",
    }
)  # fmt: skip
# How much of an answer's body is read (for a refused row's error); the rest is not awaited.
_READ_BYTES = 4_096


class WebhookTransport(QueuingTransport):
    """POSTs each message, signed, to an endpoint under ``url``; the destination is a path."""

    def __init__(
        self,
        name: str,
        url: str,
        secret: str,
        *,
        max_concurrency: int = 50,
        timeout: float = 15.0,
        connect_timeout: float = 5.0,
        close_timeout: float = 30.0,
        content_type: str = "application/json",
    ) -> None:
        super().__init__(name, close_timeout)
        self._url = url
        self._signer = Signer(secret)
        self._endpoints = Endpoints(url)
        self._gate = Gate(max_concurrency)
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout, pool=None)
        self._content_type = content_type.encode()
        self._client: httpx.AsyncClient | None = None
        self._closed = False
        # Message id -> its request's task, while the endpoint has not answered.
        self._requests: dict[str, asyncio.Task[None]] = {}
        self._answered_at = time.monotonic()  # when an endpoint last answered (or none waited)
        self._notice = StallNotice(
            logger, name, "webhook endpoint", "check the endpoint and the network to it"
        )

    @classmethod
    def from_options(cls, name: str, options: Mapping[str, Any]) -> WebhookTransport:
        """The ``webhooks`` factory: options as in ``[stores.X.transports.Y]``."""
        reader = Options(options)
        url = reader.text("url")
        if not url:
            raise TransportOptionError(
                "url", url, "is required: the endpoint's base URL, https://host/path"
            )
        check_url(url)
        secret = reader.text("secret")
        if not secret:
            raise TransportOptionError("secret", secret, "is required: whsec_ and a base64 key")
        content_type = reader.text("content_type", "application/json") or ""
        if not content_type or _FRAMING.search(content_type) or not content_type.isascii():
            raise TransportOptionError(
                "content_type", content_type, "must be a media type, e.g. application/json"
            )
        transport = cls(
            name,
            url,
            secret,
            max_concurrency=reader.integer("max_concurrency", 50, low=1, high=10_000),
            timeout=reader.seconds("timeout", 15.0),
            connect_timeout=reader.seconds("connect_timeout", 5.0),
            close_timeout=reader.seconds("close_timeout", 30.0),
            content_type=content_type,
        )
        reader.reject_unread("webhooks", _KNOWN_OPTIONS)
        return transport

    def __repr__(self) -> str:
        return f"WebhookTransport(name={self._name!r}, url={redact(self._url)!r})"

    async def start(self) -> None:
        self._closed = False
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self._timeout,
                # Never more connections than requests under way: httpcore's pool looks at
                # every connection it holds for every request.
                limits=httpx.Limits(
                    max_connections=self._gate.limit, max_keepalive_connections=self._gate.limit
                ),
                follow_redirects=False,
                trust_env=False,
            )
        logger.info(
            "webhook transport %s posts to %s",
            self._name,
            redact(self._url),
            extra={"action": "transport_start"},
        )

    async def ordered_by_key(self, destination: str) -> bool:
        """True for any destination under the url: the relay sends a key's rows one at a time,
        each after the previous one's 2xx. DestinationError for one that names no URL."""
        try:
            self._endpoints.target(destination)
        except DestinationProblem as exc:
            raise DestinationError(str(exc)) from None
        return True

    def _must_wait(self) -> bool:
        return self._gate.full()

    async def _enqueue(
        self,
        destination: str,
        *,
        key: str | None,
        message_id: str,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        settle: Outcome,
    ) -> Exception | None:
        """Start one request once its endpoint has room; the error if it fails at once.
        Raises TransportError when the transport cannot be used (closed, not started)."""
        client = self._client
        if client is None or self._closed:
            raise TransportError(
                f"webhook transport {self._name!r} is "
                f"{'closed' if self._closed else 'not started'}; call start() before publish()"
            )
        try:
            target = self._endpoints.target(destination)
        except DestinationProblem as exc:
            return SendError(str(exc), retryable=False)
        if message_id in self._requests:
            # The relay gave up waiting for the first copy (a batch deadline): the endpoint is
            # slow or stalled, not the row at fault.
            self._notice.refused(len(self._requests), self._answered_at)
            return outcomes.still_waiting(message_id, target.shown)
        try:
            request_headers = self._headers(message_id, key or None, body, extra_headers)
        except SendError as exc:
            return exc
        await self._gate.enter()
        if not self._requests:  # nothing waited for an answer: nothing is overdue
            self._answered_at = time.monotonic()
        task = asyncio.get_running_loop().create_task(
            self._post(
                client, target, message_id, body=body, headers=request_headers, settle=settle
            )
        )
        self._requests[message_id] = task
        return None

    def _headers(
        self, message_id: str, key: str | None, body: bytes, headers: Mapping[str, str] | None
    ) -> list[tuple[bytes, bytes]]:
        """The request's headers: the row's, relayer's and the signature's (SendError for a
        header HTTP cannot carry)."""
        built: list[tuple[bytes, bytes]] = []
        typed = False
        for name, value in (headers or {}).items():
            lowered = name.lower()
            if not _TOKEN.fullmatch(name):
                raise outcomes.bad_header(name, "not a valid header name")
            if lowered in _RESERVED:
                raise outcomes.bad_header(name, "the transport sets it")
            if _FRAMING.search(value):
                raise outcomes.bad_header(name, "its value has a line break or NUL")
            typed = typed or lowered == "content-type"
            built.append((name.encode(), value.encode()))
        if not typed:
            built.append((b"content-type", self._content_type))
        if key is not None:
            if _FRAMING.search(key):
                raise outcomes.bad_header(ORDERING_KEY_HEADER, "the ordering key has a line break")
            built.append((ORDERING_KEY_HEADER.encode(), key.encode()))
        timestamp = int(time.time())
        identifier = message_id.encode()
        built += [
            (MESSAGE_ID_HEADER.encode(), identifier),
            (b"webhook-id", identifier),
            (b"webhook-timestamp", str(timestamp).encode()),
            (b"webhook-signature", self._signer.signature(message_id, timestamp, body).encode()),
            (b"idempotency-key", identifier),
        ]
        return built

    async def _post(
        self,
        client: httpx.AsyncClient,
        target: Target,
        message_id: str,
        *,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        settle: Outcome,
    ) -> None:
        try:
            error, answered = await self._request(client, target, body, headers)
        except asyncio.CancelledError:  # closed before the endpoint answered
            settle(outcomes.closed(self._name))
            raise
        finally:
            self._gate.leave()
            if self._requests.get(message_id) is asyncio.current_task():
                del self._requests[message_id]
        if answered:
            self._answered_at = time.monotonic()
            if self._notice.since is not None:
                self._notice.acknowledged()
        settle(error)

    async def _request(
        self,
        client: httpx.AsyncClient,
        target: Target,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
    ) -> tuple[Exception | None, bool]:
        """POST ``body`` to ``target``: the relay's error (None on a 2xx), and whether the
        endpoint answered at all."""
        try:
            async with client.stream("POST", target.url, content=body, headers=headers) as response:
                status = response.status_code
                # Read (the start of) the answer either way: a connection is reused only once
                # its answer was read to the end.
                excerpt = await _read_some(response)
                if 200 <= status < 300:
                    return None, True
                location = response.headers.get("location")
                reason = response.reason_phrase
                return outcomes.refused(target.shown, status, reason, excerpt, location), True
        except httpx.HTTPError as exc:  # refused, reset, timed out: no answer
            if isinstance(exc, httpx.TimeoutException):
                # Silence for ``timeout``: a stalled endpoint (said once, until it answers).
                self._notice.refused(len(self._requests), self._answered_at)
            return outcomes.unreachable(target.shown, exc), False

    def _closes_unanswered(self, count: int) -> None:
        logger.warning(
            "webhook transport %s closes with %s requests unanswered; their rows are sent "
            "again by the next owner",
            self._name,
            count,
            extra={"action": "transport_close", "rows": count},
        )

    async def close_within(self, seconds: float) -> None:
        """``close``, returning within ``seconds`` (and ``close_timeout``) whatever the
        endpoints do: a stopping worker passes what is left of its stop budget. Requests still
        unanswered then are abandoned and fail as "will be sent again"."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + max(min(seconds, self._close_timeout), 0.0)
        await wait_then_abandon(list(self._requests.values()), deadline, self._closes_unanswered)
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def check_url(url: str) -> None:
    """Refuse a base URL that is not http(s)://host/... (TransportOptionError)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TransportOptionError(
            "url", url, "must be an http:// or https:// URL with a host, e.g. https://host/hooks"
        )
    if parts.query or parts.fragment:
        raise TransportOptionError(
            "url", url, "must have no query or fragment (put a query in the destination)"
        )


async def _read_some(response: httpx.Response) -> bytes:
    """The start of ``response``'s body, at most ``_READ_BYTES``."""
    read = b""
    try:
        async for chunk in response.aiter_raw():
            read += chunk
            if len(read) >= _READ_BYTES:
                break
    except httpx.HTTPError:
        pass  # the status says enough
    return read[:_READ_BYTES]
