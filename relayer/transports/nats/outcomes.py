"""What a NATS JetStream publish that did not get through means to the relay.

A subject no stream captures, a subject or header NATS cannot carry, a message over the
server's max_payload: the row's fault, a non-retryable SendError that says what to fix. A
stream that refused the message for now (full, with ``discard: new``) is retried. A connection
lost or reconnecting, JetStream unavailable, an acknowledgement that did not come in time, or a
copy refused while an earlier copy still waits: nobody's fault (TransportUnavailableError), the
row is sent again and no attempt is counted. This module does not touch the connection.
"""

from __future__ import annotations

from collections.abc import Mapping

import nats.errors
import nats.js.errors

from relayer.redact import redact
from relayer.transports.base import SendError, TransportUnavailableError

# JetStream's error codes (err_code) for a message that can never be stored as it is.
_TOO_LARGE = 10054  # message size exceeds maximum allowed
_PERMANENT_CODES = frozenset({_TOO_LARGE})

_SUBJECT_SPECIALS = frozenset(" \t\r\n*>")


def subject_problem(subject: str) -> str | None:
    """None if ``subject`` is a subject one can publish to, else what is wrong with it."""
    if not subject:
        return "the destination is empty; name the NATS subject to publish to"
    if any(character in _SUBJECT_SPECIALS for character in subject) or "" in subject.split("."):
        return (
            f"destination {subject[:80]!r} is not a NATS subject one can publish to (tokens "
            "separated by dots, no spaces, no wildcards * or >); fix the destination"
        )
    return None


def header_problem(headers: Mapping[str, str]) -> SendError | None:
    """A SendError if NATS cannot carry one of ``headers`` unchanged."""
    for name, value in headers.items():
        if not name or any(c in name for c in ": \t\r\n") or not name.isascii():
            return SendError(
                f"header name {name[:40]!r} cannot be carried by NATS (ASCII, no spaces, "
                "colons or line breaks); write the row with another header name",
                retryable=False,
            )
        if "\r" in value or "\n" in value:
            return SendError(
                f"the value of header {name[:40]!r} holds a line break, which NATS headers "
                "cannot carry; write the row without it",
                retryable=False,
            )
    return None


def too_large(subject: str, size: int, limit: int) -> SendError:
    return SendError(
        f"the message for NATS subject {subject!r} is {size:,} bytes with its headers; the "
        f"server's max_payload is {limit:,}; raise max_payload on the server or send a "
        "smaller body",
        retryable=False,
    )


def no_stream(subject: str) -> str:
    return (
        f"no JetStream stream captures NATS subject {subject!r} (or JetStream is not enabled "
        "on the server); create a stream whose subjects include it (nats stream add) or fix "
        "the destination"
    )


def refused(error: BaseException, subject: str) -> Exception:
    """The relay's error for a publish to ``subject`` the server did not acknowledge
    (``error``: what nats-py said, or ours when the connection went)."""
    if isinstance(error, TransportUnavailableError | SendError):
        return error
    if isinstance(error, nats.js.errors.NoStreamResponseError | nats.errors.NoRespondersError):
        return SendError(no_stream(subject), retryable=False)
    if isinstance(error, nats.js.errors.ServiceUnavailableError):
        return unavailable(subject, error)
    if isinstance(error, nats.js.errors.APIError):
        description = redact(str(error.description or error))
        if error.err_code in _PERMANENT_CODES:
            return SendError(
                f"JetStream refused the message for subject {subject!r}: {description}; fix the "
                "row or the stream's limits, then redrive the key",
                retryable=False,
            )
        return SendError(
            f"JetStream refused the message for subject {subject!r}: {description} (a full "
            "stream with discard new, say); the message will be retried"
        )
    if isinstance(error, nats.errors.MaxPayloadError):
        return SendError(
            f"the message for NATS subject {subject!r} is over the server's max_payload; "
            "raise max_payload on the server or send a smaller body",
            retryable=False,
        )
    if isinstance(error, nats.errors.BadSubjectError):
        return SendError(subject_problem(subject) or str(error), retryable=False)
    return unavailable(subject, error)


def unavailable(subject: str, error: BaseException) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"NATS did not acknowledge a message for subject {subject!r} "
        f"({type(error).__name__}: {redact(str(error))}); the message will be sent again"
    )


def still_unacknowledged(message_id: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"an earlier copy of message {message_id} is still waiting for JetStream's "
        "acknowledgement (the server is slow or stalled); this copy will be sent again after it"
    )


def connection_lost(shown_url: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"the connection to NATS at {shown_url} was lost before JetStream acknowledged the "
        "message; it will be sent again"
    )


def not_acknowledged_in_time(seconds: float) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"JetStream did not acknowledge the message within ack_timeout ({seconds:g} s): the "
        "server is slow or stalled; it will be sent again (the Nats-Msg-Id header lets "
        "JetStream drop the copy within its duplicate window)"
    )
