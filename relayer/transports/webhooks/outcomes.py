"""What a webhook request that did not get a 2xx means to the relay.

- 2xx: delivered.
- 408, 425 and 429 (the endpoint asks to be called later), 5xx, a timeout, a refused or reset
  connection: the endpoint's fault, like a broker outage. The row is sent again later and no
  attempt is counted against it or its key.
- Any other 4xx, and a redirect (requests are not redirected: the signature names no URL, and a
  redirect to another server would take the signed body there): the row's fault. Its key is
  parked with the status and the start of the endpoint's answer (redacted), until an operator
  fixes the endpoint or the row and redrives the key.

This module does not touch the connection.
"""

from __future__ import annotations

import re

from relayer.redact import redact
from relayer.transports.base import SendError, TransportUnavailableError

LATER_STATUSES = frozenset({408, 425, 429})
# How much of an answer's body a parked key's error shows.
EXCERPT_CHARS = 200
_SPACE = re.compile(r"\s+")


def refused(url: str, status: int, reason: str, body: bytes, location: str | None) -> Exception:
    """The relay's error for an answer with ``status`` (not 2xx) from ``url``."""
    said = f"{status} {reason}".strip()
    if status in LATER_STATUSES or status >= 500:
        return TransportUnavailableError(
            f"webhook endpoint {url} answered {said}{_excerpt(body)}; the message will be sent "
            "again once it accepts requests (no attempt is counted)"
        )
    if 300 <= status < 400:
        return SendError(
            f"webhook endpoint {url} answered {said}, a redirect to {redact(location or '?')}; "
            "requests are not redirected: set the transport's url (or the destination) to the "
            "final address, then redrive the key",
            retryable=False,
        )
    return SendError(
        f"webhook endpoint {url} refused the message: {said}{_excerpt(body)}; fix the endpoint "
        "or the row (destination, body, headers), then redrive the key",
        retryable=False,
    )


def unreachable(url: str, error: BaseException) -> TransportUnavailableError:
    """A request that got no answer: refused, reset, timed out."""
    kind = type(error).__name__
    text = redact(str(error)) or "no details"
    return TransportUnavailableError(
        f"webhook endpoint {url} did not answer ({kind}: {text}); the message will be sent "
        "again once it answers (no attempt is counted)"
    )


def still_waiting(message_id: str, url: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"an earlier request for message {message_id} to {url} still waits for the endpoint's "
        "answer (it is slow or stalled); this copy will be sent again after it"
    )


def closed(name: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"webhook transport {name!r} closed before the endpoint answered; the message will be "
        "sent again"
    )


def bad_header(name: str, problem: str) -> SendError:
    return SendError(
        f"header {name[:40]!r} cannot be sent in an HTTP request: {problem}; write the row "
        "with a valid header (names are letters, digits and !#$%&'*+-.^_`|~; values have no "
        "line breaks)",
        retryable=False,
    )


def _excerpt(body: bytes) -> str:
    text = _SPACE.sub(" ", body[: EXCERPT_CHARS * 4].decode("utf-8", "replace")).strip()
    if not text:
        return ""
    if len(text) > EXCERPT_CHARS:
        text = text[:EXCERPT_CHARS] + "..."
    return f" ({redact(text)!r})"
