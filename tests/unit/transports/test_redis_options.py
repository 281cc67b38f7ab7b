"""The Redis transport's options and what its answers mean (no server needed)."""

from __future__ import annotations

from typing import Any

import pytest
import redis.exceptions

from relayer.errors import ConfigurationError
from relayer.settings import TransportSettings
from relayer.transports.base import SendError, TransportUnavailableError
from relayer.transports.redis import RedisTransport
from relayer.transports.redis.outcomes import refused
from relayer.transports.redis.transport import _capability_problem
from relayer.transports.registry import create_transport


def redis_transport(**options: Any) -> Any:
    return create_transport("orders", "bus", TransportSettings(type="redis", **options))


def test_options_are_read_and_the_password_never_shown() -> None:
    transport = redis_transport(url="redis://relayer:hunter2@h:6379/0", maxlen="1000")
    assert isinstance(transport, RedisTransport)
    assert transport.pipelines_within_key is False
    assert "hunter2" not in repr(transport) and "h:6379" in repr(transport)


@pytest.mark.parametrize(
    ("options", "field", "rule"),
    [
        ({}, "url", "is required"),
        ({"url": "http://h"}, "url", "must start with redis://"),
        ({"url": "redis://:hunter2@h", "maxlen": -1}, "maxlen", "at least 0"),
        ({"url": "redis://h", "maxlen": "many"}, "maxlen", "whole number"),
        ({"url": "redis://h", "create_streams": "maybe"}, "create_streams", "true or false"),
        ({"url": "redis://h", "socket_timeout": 0}, "socket_timeout", "greater than 0"),
        ({"url": "redis://h", "stream": "x"}, "stream", "not an option of the redis transport"),
    ],
)
def test_a_bad_option_is_one_line_naming_the_field_the_value_and_the_rule(
    options: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        redis_transport(**options)
    assert caught.value.field == f"stores.orders.transports.bus.{field}"
    assert rule in caught.value.rule
    assert "hunter2" not in str(caught.value) and "\n" not in str(caught.value)


def test_what_the_servers_answers_mean() -> None:
    wrong = refused(redis.exceptions.ResponseError("WRONGTYPE Operation against a key"), "s")
    assert isinstance(wrong, SendError) and wrong.retryable is False
    for state in (
        redis.exceptions.OutOfMemoryError("OOM command not allowed"),
        redis.exceptions.ReadOnlyError("READONLY You can't write against a read only replica"),
        redis.exceptions.ResponseError("LOADING Redis is loading the dataset in memory"),
        redis.exceptions.ConnectionError("Connection reset by peer"),
        redis.exceptions.TimeoutError("Timeout reading from socket"),
    ):
        assert isinstance(refused(state, "s"), TransportUnavailableError), state
    other = refused(redis.exceptions.ResponseError("ERR something else"), "s")
    assert isinstance(other, SendError) and other.retryable is True


def test_a_server_without_streams_is_refused_at_start() -> None:
    assert _capability_problem("7.2.4", create_streams=False) is None
    assert "5.0 or later" in (_capability_problem("4.0.14", create_streams=True) or "")
    assert "NOMKSTREAM" in (_capability_problem("6.0.9", create_streams=False) or "")
