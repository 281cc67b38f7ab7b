"""The Kafka transport's rules: which librdkafka settings are safe, and what errors mean.

Kept apart from the transport so the rules read on their own and are tested without a broker.
This module does not import confluent_kafka: librdkafka errors are matched by name
(``KafkaError.name()``), settings are plain dictionaries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from relayer.errors import Shown
from relayer.redact import MASK, is_secret_name, redact
from relayer.transports.base import OutgoingMessage, SendError
from relayer.transports.options import TransportOptionError

# librdkafka's own default; kept unless the relay's batch deadline needs more.
DEFAULT_MESSAGE_TIMEOUT_MS = 300_000
MAX_IN_FLIGHT = 5
# The relay hands librdkafka a whole batch at once, so waiting for more messages before sending
# (librdkafka's default linger of 5 ms) only adds latency; kept if the user sets either name.
# 0: at a steady 1,000 rows/s (bench/efficiency.py --steady) 1 ms of linger was most of the
# produce-to-acknowledgement time (the broker answers in a fraction of a millisecond), and a
# backlog's drain costs no more without it (the rows that queue while requests are in flight
# still go together).
DEFAULT_LINGER_MS = 0
_LINGER_NAMES = ("linger.ms", "queue.buffering.max.ms")
_OWNED = ("error_cb", "logger", "on_delivery", "dr_cb", "dr_msg_cb")
_TIMEOUT_NAMES = ("message.timeout.ms", "delivery.timeout.ms")
_IN_FLIGHT_NAMES = ("max.in.flight.requests.per.connection", "max.in.flight")

_TOO_LARGE = frozenset({"MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"})
_NO_TOPIC = frozenset({"UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION"})
_BAD_NAME = frozenset({"TOPIC_EXCEPTION", "INVALID_TOPIC_EXCEPTION"})
_REJECTED = frozenset({"INVALID_RECORD", "POLICY_VIOLATION", "CORRUPT_MESSAGE"})


def check_config(config: Mapping[str, Any], batch_deadline: timedelta | None) -> dict[str, Any]:
    """The producer settings: the user's, checked, with the ordering-critical ones fixed."""
    settings = dict(config)
    for name in _OWNED:
        if name in settings:
            raise TransportOptionError(name, settings[name], "is set by relayer; remove it")
    if "transactional.id" in settings:
        raise TransportOptionError(
            "transactional.id",
            settings["transactional.id"],
            "relayer uses an idempotent, non-transactional producer; remove it",
        )
    if not (settings.get("bootstrap.servers") or settings.get("metadata.broker.list")):
        raise TransportOptionError(
            "bootstrap.servers",
            None,
            "is required: the brokers to connect to, e.g. 'kafka1:9092,kafka2:9092'",
        )
    _require(settings, "acks", ("all", "-1", -1), "all")
    _require(settings, "enable.idempotence", (True, "true"), True)
    _require(settings, "enable.gapless.guarantee", (True, "true"), True)
    for name in _IN_FLIGHT_NAMES:
        if name in settings:
            value = _integer(name, settings[name])
            if not 1 <= value <= MAX_IN_FLIGHT:
                raise TransportOptionError(
                    name,
                    settings[name],
                    f"must be from 1 to {MAX_IN_FLIGHT}: the idempotent producer keeps order "
                    "only with at most 5 requests in flight per connection",
                )
    _check_timeout(settings, batch_deadline)
    _check_queue_size(settings)
    settings.setdefault("allow.auto.create.topics", False)
    if not any(name in settings for name in _LINGER_NAMES):
        settings["linger.ms"] = DEFAULT_LINGER_MS
    return settings


_PROPERTY = re.compile(r'property:? "(?P<name>[^"]+)"')
_QUOTED_VALUE = re.compile(r'value "[^"]*"')


def refused_settings(
    transport: str, config: Mapping[str, Any], reason: str
) -> TransportOptionError:
    """librdkafka's refusal of the producer settings, naming the one setting it quotes (such as
    a misspelled ``linger.mss``) rather than showing them all."""
    match = _PROPERTY.search(reason)
    if match is None or match["name"] not in config:
        return TransportOptionError(
            f"transports.{transport}",
            Shown.names_of(config),
            f"librdkafka refused the settings: {reason}",
        )
    name = match["name"]
    if is_secret_name(name):
        reason = _QUOTED_VALUE.sub(f'value "{MASK}"', reason)
    rule = (
        "is not a librdkafka setting; fix its name (see librdkafka's CONFIGURATION.md) or remove it"
        if "No such configuration property" in reason
        else f"librdkafka refused it: {reason}"
    )
    return TransportOptionError(f"transports.{transport}.{name}", config[name], rule)


def _require(settings: dict[str, Any], name: str, allowed: tuple[Any, ...], value: Any) -> None:
    given = settings.get(name, value)
    shown = given.lower() if isinstance(given, str) else given
    if shown not in allowed:
        raise TransportOptionError(
            name,
            given,
            f"must be {value!s}".lower() + ": per-key order after a failure depends on it "
            "(remove the setting to get the safe value)",
        )
    settings[name] = value


def _check_timeout(settings: dict[str, Any], batch_deadline: timedelta | None) -> None:
    deadline_ms = int(batch_deadline.total_seconds() * 1000) if batch_deadline else 0
    given = [name for name in _TIMEOUT_NAMES if name in settings]
    if not given:
        settings["message.timeout.ms"] = max(DEFAULT_MESSAGE_TIMEOUT_MS, 2 * deadline_ms)
        return
    for name in given:
        value = _integer(name, settings[name])
        # 0 means no timeout at all, which is above any deadline.
        if value != 0 and value <= deadline_ms:
            raise TransportOptionError(
                name,
                settings[name],
                f"must be greater than the relay's batch deadline ({deadline_ms} ms, half the "
                "store's lease_duration): the gapless guarantee does not cover this timeout, "
                f"so a shorter one lets a key's later message overtake an earlier one; use at "
                f"least {2 * deadline_ms} or shorten lease_duration",
            )


def _check_queue_size(settings: Mapping[str, Any]) -> None:
    """librdkafka's local queue must hold the largest message, or such a message waits for
    room that never comes."""
    if "queue.buffering.max.kbytes" not in settings:
        return
    queue_kbytes = _integer("queue.buffering.max.kbytes", settings["queue.buffering.max.kbytes"])
    largest = _integer("message.max.bytes", settings.get("message.max.bytes", 1_000_000))
    if queue_kbytes * 1024 < largest:
        raise TransportOptionError(
            "queue.buffering.max.kbytes",
            settings["queue.buffering.max.kbytes"],
            f"must hold at least one message of message.max.bytes ({largest:,} bytes, "
            f"{-(-largest // 1024):,} kbytes): a larger message could never be queued",
        )


def _integer(name: str, value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise TransportOptionError(name, value, "must be a whole number") from None


def topic_error(topic: str, metadata: Any) -> str | None:
    """None if ``metadata`` (a ClusterMetadata) shows ``topic``, else what to do about it."""
    found = metadata.topics.get(topic)
    error = None if found is None else found.error
    if found is not None and error is None and found.partitions:
        return None
    name = error.name() if error is not None else "UNKNOWN_TOPIC_OR_PART"
    if name == "TOPIC_AUTHORIZATION_FAILED":
        return (
            f"not authorized to access Kafka topic {topic!r}; grant the relay's principal "
            "DESCRIBE and WRITE on it"
        )
    if name in _BAD_NAME:
        return f"{topic!r} is not a valid Kafka topic name; fix the destination"
    if name in _NO_TOPIC:
        return (
            f"Kafka topic {topic!r} does not exist; create it (e.g. kafka-topics.sh --create "
            f"--topic {topic}) or fix the destination"
        )
    return f"metadata for Kafka topic {topic!r} reports {name}: {error.str() if error else ''}"


def delivery_error(error: Any, report: Any, max_bytes: int) -> SendError:
    """A SendError for a failed delivery report (``error`` is a KafkaError)."""
    topic = report.topic() if report is not None else "?"
    size = len(report.value() or b"") if report is not None else 0
    return _translate(error, topic, size, max_bytes)


def produce_error(exc: Exception, message: OutgoingMessage, max_bytes: int) -> SendError:
    """A SendError for a message ``produce()`` refused locally."""
    error = exc.args[0] if exc.args else exc
    return _translate(error, message.destination, len(message.body), max_bytes)


def _translate(error: Any, topic: str, size: int, max_bytes: int) -> SendError:
    name = error.name() if hasattr(error, "name") else type(error).__name__
    text = redact(f"{name}: {error.str() if hasattr(error, 'str') else error}")
    if name in _TOO_LARGE:
        return SendError(
            f"Kafka refused a {size:,}-byte message for topic {topic!r} as too large ({text}); "
            f"shrink the body, or raise the producer's message.max.bytes (now {max_bytes:,}) "
            "together with the topic's max.message.bytes and the broker's message.max.bytes",
            retryable=False,
        )
    if name in _NO_TOPIC:
        return SendError(
            f"Kafka topic {topic!r} does not exist ({text}); create it or fix the destination",
            retryable=False,
        )
    if name in _BAD_NAME:
        return SendError(
            f"{topic!r} is not a valid Kafka topic name ({text}); fix the destination",
            retryable=False,
        )
    if name == "TOPIC_AUTHORIZATION_FAILED":
        return SendError(
            f"not authorized to write to Kafka topic {topic!r} ({text}); grant the relay's "
            "principal WRITE (and DESCRIBE) on the topic",
            retryable=False,
        )
    if name == "CLUSTER_AUTHORIZATION_FAILED":
        return SendError(
            f"not authorized to produce idempotently to {topic!r} ({text}); grant the "
            "relay's principal IDEMPOTENT_WRITE on the cluster",
            retryable=False,
        )
    if name in _REJECTED:
        return SendError(
            f"Kafka topic {topic!r} rejected the record ({text}); a compacted topic needs an "
            "ordering key, and topic policies may refuse headers or sizes: fix the row or "
            "the topic",
            retryable=False,
        )
    if name == "_MSG_TIMED_OUT":
        return SendError(
            f"no acknowledgement from Kafka for topic {topic!r} within message.timeout.ms "
            f"({text}); the message will be retried"
        )
    return SendError(f"Kafka did not acknowledge a message for topic {topic!r} ({text})")
