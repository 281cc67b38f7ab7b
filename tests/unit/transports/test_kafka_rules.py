"""The Kafka transport's settings rules and error translation (no broker)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from relayer.errors import ConfigurationError, TransportError
from relayer.transports.base import OutgoingMessage
from relayer.transports.kafka.rules import (
    DEFAULT_MESSAGE_TIMEOUT_MS,
    check_config,
    delivery_error,
    produce_error,
    refused_settings,
    topic_error,
)
from relayer.transports.options import TransportOptionError

BASE = {"bootstrap.servers": "kafka:9092"}


def test_ordering_critical_settings_are_fixed() -> None:
    config = check_config(BASE, timedelta(seconds=15))
    assert config["acks"] == "all"
    assert config["enable.idempotence"] is True
    assert config["enable.gapless.guarantee"] is True
    assert config["allow.auto.create.topics"] is False
    assert config["message.timeout.ms"] == DEFAULT_MESSAGE_TIMEOUT_MS


def test_linger_defaults_to_none_unless_set() -> None:
    assert check_config(BASE, None)["linger.ms"] == 0
    assert check_config({**BASE, "linger.ms": 20}, None)["linger.ms"] == 20
    kept = check_config({**BASE, "queue.buffering.max.ms": 7}, None)
    assert kept["queue.buffering.max.ms"] == 7 and "linger.ms" not in kept


def test_a_long_deadline_raises_the_default_timeout() -> None:
    config = check_config(BASE, timedelta(minutes=30))
    assert config["message.timeout.ms"] == 2 * 30 * 60 * 1000


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("acks", "1", "must be all"),
        ("enable.idempotence", False, "must be true"),
        ("enable.gapless.guarantee", "false", "must be true"),
        ("max.in.flight.requests.per.connection", 6, "from 1 to 5"),
        ("max.in.flight", "10", "from 1 to 5"),
        ("transactional.id", "tx", "non-transactional"),
        ("error_cb", "x", "set by relayer"),
        ("message.timeout.ms", 10_000, "greater than the relay's batch deadline (15000 ms"),
        ("delivery.timeout.ms", "15000", "use at least 30000"),
        ("queue.buffering.max.kbytes", 900, "at least one message of message.max.bytes (1,000,000"),
    ],
)
def test_unsafe_settings_are_refused(name: str, value: Any, words: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_config({**BASE, name: value}, timedelta(seconds=15))
    assert isinstance(caught.value, TransportError)
    assert caught.value.field == name
    assert words in str(caught.value)


def test_timeouts_above_the_deadline_or_infinite_are_accepted() -> None:
    assert check_config({**BASE, "message.timeout.ms": 20_000}, timedelta(seconds=15))
    assert check_config({**BASE, "message.timeout.ms": 0}, timedelta(seconds=15))


def test_a_local_queue_that_holds_the_largest_message_is_accepted() -> None:
    assert check_config({**BASE, "queue.buffering.max.kbytes": 977}, None)
    assert check_config({**BASE, "queue.buffering.max.kbytes": 1, "message.max.bytes": 1024}, None)


def test_bootstrap_servers_are_required() -> None:
    with pytest.raises(ConfigurationError, match=r"bootstrap\.servers"):
        check_config({"linger.ms": 5}, None)


def test_secrets_never_show_in_errors() -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_config({"sasl.password": "hunter2", "acks": 0}, None)
    assert "hunter2" not in str(caught.value)
    error = TransportOptionError("sasl.password", "hunter2", "is wrong")
    assert "hunter2" not in str(error)


class FakeError:
    def __init__(self, name: str, text: str = "broker says") -> None:
        self._name = name
        self._text = text

    def name(self) -> str:
        return self._name

    def str(self) -> str:
        return self._text


class FakeReport:
    def __init__(self, topic: str, value: bytes) -> None:
        self._topic = topic
        self._value = value

    def topic(self) -> str:
        return self._topic

    def value(self) -> bytes:
        return self._value


@pytest.mark.parametrize(
    ("name", "retryable", "words"),
    [
        ("MSG_SIZE_TOO_LARGE", False, "message.max.bytes"),
        ("UNKNOWN_TOPIC_OR_PART", False, "create it"),
        ("_UNKNOWN_TOPIC", False, "create it"),
        ("TOPIC_AUTHORIZATION_FAILED", False, "WRITE"),
        ("CLUSTER_AUTHORIZATION_FAILED", False, "IDEMPOTENT_WRITE"),
        ("INVALID_RECORD", False, "compacted"),
        ("_MSG_TIMED_OUT", True, "message.timeout.ms"),
        ("NOT_LEADER_FOR_PARTITION", True, "did not acknowledge"),
    ],
)
def test_delivery_errors_say_what_to_fix(name: str, retryable: bool, words: str) -> None:
    error = delivery_error(FakeError(name), FakeReport("orders", b"x" * 10), 1_000_000)
    assert error.retryable is retryable
    assert words in str(error)
    assert "orders" in str(error)


def test_local_refusals_are_translated_too() -> None:
    message = OutgoingMessage(uuid.uuid4(), "orders", b"x" * 2_000_000, key="a")
    error = produce_error(Exception(FakeError("MSG_SIZE_TOO_LARGE")), message, 1_000_000)
    assert not error.retryable
    assert "2,000,000-byte" in str(error) and "shrink the body" in str(error)


class FakeTopic:
    def __init__(self, error: FakeError | None, partitions: int = 1) -> None:
        self.error = error
        self.partitions = dict.fromkeys(range(partitions))


class FakeMetadata:
    def __init__(self, **topics: FakeTopic) -> None:
        self.topics = topics


def test_topic_lookup_results() -> None:
    assert topic_error("orders", FakeMetadata(orders=FakeTopic(None))) is None
    assert "does not exist" in (topic_error("orders", FakeMetadata()) or "")
    missing = FakeMetadata(orders=FakeTopic(FakeError("UNKNOWN_TOPIC_OR_PART"), 0))
    assert "create it" in (topic_error("orders", missing) or "")
    denied = FakeMetadata(orders=FakeTopic(FakeError("TOPIC_AUTHORIZATION_FAILED")))
    assert "DESCRIBE and WRITE" in (topic_error("orders", denied) or "")


async def test_a_misspelled_secret_is_masked_in_librdkafkas_refusal() -> None:
    from relayer.transports.kafka import KafkaTransport

    settings = {"bootstrap.servers": "127.0.0.1:1", "sasl.passowrd": "hunter2"}
    transport = KafkaTransport("k", settings)
    try:
        with pytest.raises(ConfigurationError) as caught:
            await transport.start()
    finally:
        await transport.close()
    assert str(caught.value) == (
        "transports.k.sasl.passowrd: '***' is invalid: is not a librdkafka setting; fix its name "
        "(see librdkafka's CONFIGURATION.md) or remove it"
    )
    assert "hunter2" not in str(caught.value) and "hunter2" not in repr(transport)


def test_librdkafka_refusing_one_setting_names_that_setting_only() -> None:
    config = {**BASE, "sasl.password": "hunter2", "linger.mss": 5}
    error = refused_settings(
        "events", config, '_INVALID_ARG: No such configuration property: "linger.mss"'
    )
    assert str(error) == (
        "transports.events.linger.mss: 5 is invalid: is not a librdkafka setting; fix its name "
        "(see librdkafka's CONFIGURATION.md) or remove it"
    )
    secret = refused_settings(
        "events",
        config,
        '_INVALID_ARG: Invalid value "hunter2" for configuration property "sasl.password"',
    )
    assert "hunter2" not in str(secret)
    assert str(secret).startswith("transports.events.sasl.password: '***' is invalid:")
    other = refused_settings("events", config, "_INVALID_ARG: something else")
    assert str(other) == (
        "transports.events: {bootstrap.servers, sasl.password, linger.mss} is invalid: "
        "librdkafka refused the settings: _INVALID_ARG: something else"
    )
