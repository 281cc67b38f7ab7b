"""What a RabbitMQ publish that did not get through means to the relay.

A message the broker cannot route, or one AMQP cannot carry, is the row's fault: a
non-retryable SendError that says what to fix. A nack is retried. A channel or connection lost
before the broker confirmed, or a copy refused while an earlier copy still waits for its
confirm, is nobody's fault: TransportUnavailableError, the row is sent again and no attempt is
counted. This module does not touch the connection.
"""

from __future__ import annotations

import aiormq

from relayer.redact import redact
from relayer.transports.base import SendError, TransportUnavailableError
from relayer.transports.rabbitmq.routes import Route

# AMQP field-table names are short strings of at most 128 bytes; the client would cut a longer
# header name short without a word, so such a message is failed instead.
MAX_HEADER_NAME_BYTES = 128


def refused(error: BaseException, route: Route, routing_key: str) -> Exception:
    """The relay's error for a publish to ``route`` the broker did not confirm (``error``:
    what aiormq said, or the reason the channel closed)."""
    if isinstance(error, aiormq.exceptions.PublishError):
        return SendError(unroutable(route, routing_key), retryable=False)
    if isinstance(error, aiormq.exceptions.DeliveryError):
        return SendError(
            f"RabbitMQ refused (nack) a message for {route.destination!r}: the queue "
            "may be full with overflow=reject-publish; the message will be retried"
        )
    if isinstance(error, aiormq.exceptions.ChannelNotFoundEntity):
        return TransportUnavailableError(
            f"RabbitMQ closed the publishing channel ({redact(str(error))}) before it "
            f"confirmed a message for {route.destination!r}; it will be sent again"
        )
    return lost(route, error)  # a lost channel/connection fails every outstanding confirm


def lost(route: Route, error: BaseException) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"RabbitMQ connection or channel lost before the broker confirmed a message "
        f"for {route.destination!r} ({type(error).__name__}: {redact(str(error))}); "
        "the message will be sent again"
    )


def still_unconfirmed(message_id: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"an earlier copy of message {message_id} is still waiting for RabbitMQ's confirm "
        "(the broker is slow to confirm or stalled); this copy will be sent again after it"
    )


def unroutable(route: Route, routing_key: str) -> str:
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


def long_header_name(name: str) -> SendError:
    return SendError(
        f"header name {name[:40]!r}... is {len(name.encode()):,} bytes; AMQP header names are at "
        f"most {MAX_HEADER_NAME_BYTES} bytes and RabbitMQ would receive it cut short; write the "
        "row with a shorter header name",
        retryable=False,
    )


def not_encodable(error: Exception) -> SendError:
    return SendError(
        f"cannot encode the message for RabbitMQ ({type(error).__name__}: {error}); "
        "fix the row's headers or destination",
        retryable=False,
    )
