"""What an XADD that did not get through means to the relay.

A key of another type (WRONGTYPE), or a stream that does not exist when streams are not
created (``create_streams = false``): the row's fault, a non-retryable SendError that says what
to fix. An answer the server gives whatever the row (out of memory, a read-only replica,
loading, no permission, a lost or silent connection): not the row's fault
(TransportUnavailableError), the row is sent again and no attempt is counted. This module does
not touch the connection.
"""

from __future__ import annotations

import redis.exceptions

from relayer.redact import redact
from relayer.transports.base import SendError, TransportUnavailableError

# Answers of a server that cannot take writes now, whatever is written (the first word of the
# error: redis-py names only some of them with a type).
_SERVER_STATES = ("OOM", "READONLY", "LOADING", "MISCONF", "BUSY", "NOPERM", "NOAUTH", "MASTERDOWN")


def wrong_type(stream: str, kind: str = "another type") -> str:
    return (
        f"Redis key {stream!r} holds {kind}, not a stream (WRONGTYPE); fix the destination, or "
        "rename or delete that key"
    )


def missing_stream(stream: str) -> str:
    return (
        f"Redis stream {stream!r} does not exist and create_streams is false; create it "
        "(XGROUP CREATE ... MKSTREAM) or fix the destination"
    )


def refused(error: BaseException, stream: str) -> Exception:
    """The relay's error for an XADD to ``stream`` that failed with ``error``."""
    if isinstance(error, TransportUnavailableError | SendError):
        return error
    if isinstance(error, redis.exceptions.ResponseError):
        text = str(error)
        if text.startswith("WRONGTYPE"):
            return SendError(wrong_type(stream), retryable=False)
        if isinstance(
            error, redis.exceptions.OutOfMemoryError | redis.exceptions.ReadOnlyError
        ) or text.startswith(_SERVER_STATES):
            return unavailable(stream, error)
        return SendError(
            f"Redis refused the XADD to stream {stream!r}: {redact(text)}; the message will be "
            "retried"
        )
    return unavailable(stream, error)


def unavailable(stream: str, error: BaseException) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"Redis did not take the message for stream {stream!r} ({type(error).__name__}: "
        f"{redact(str(error))}); the message will be sent again"
    )


def still_unanswered(message_id: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"an earlier copy of message {message_id} is still waiting for Redis's answer (the "
        "server is slow or stalled); this copy will be sent again after it"
    )
