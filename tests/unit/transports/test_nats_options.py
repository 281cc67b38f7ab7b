"""The NATS transport's options and what it refuses before sending (no server needed)."""

from __future__ import annotations

from typing import Any

import pytest

from relayer.errors import ConfigurationError
from relayer.settings import TransportSettings
from relayer.transports.nats import NatsTransport
from relayer.transports.nats.outcomes import header_problem, subject_problem
from relayer.transports.registry import create_transport


def nats(**options: Any) -> Any:
    return create_transport("orders", "bus", TransportSettings(type="nats", **options))


def test_options_are_read_and_the_password_never_shown() -> None:
    transport = nats(url="nats://relayer:hunter2@h:4222,nats://h2:4222", ack_timeout="5")
    assert isinstance(transport, NatsTransport)
    assert transport.pipelines_within_key is False
    assert "hunter2" not in repr(transport) and "h2:4222" in repr(transport)


def test_a_token_in_the_url_is_never_shown() -> None:
    transport = nats(url="nats://s3cr3tt0ken@h:4222, tls://relayer:hunter2@h2:4222")
    assert repr(transport) == (
        "NatsTransport(name='bus', url='nats://***@h:4222, tls://relayer:***@h2:4222')"
    )
    with pytest.raises(ConfigurationError) as caught:
        nats(url="nats://s3cr3tt0ken@h:4222,http://h2")
    assert "s3cr3tt0ken" not in str(caught.value)


@pytest.mark.parametrize(
    ("options", "field", "rule"),
    [
        ({}, "url", "is required"),
        ({"url": "amqp://h"}, "url", "must be nats://"),
        ({"url": "nats://u:hunter2@h", "max_outstanding": 0}, "max_outstanding", "at least 1"),
        ({"url": "nats://h", "ack_timeout": "soon"}, "ack_timeout", "number of seconds"),
        ({"url": "nats://h", "stream": "x"}, "stream", "not an option of the nats transport"),
    ],
)
def test_a_bad_option_is_one_line_naming_the_field_the_value_and_the_rule(
    options: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        nats(**options)
    assert caught.value.field == f"stores.orders.transports.bus.{field}"
    assert rule in caught.value.rule
    assert "hunter2" not in str(caught.value) and "\n" not in str(caught.value)


def test_subjects_one_cannot_publish_to_are_named() -> None:
    assert subject_problem("orders.created") is None
    for bad in ("", "orders.*", "orders.>", "two words", "orders..created", ".orders"):
        problem = subject_problem(bad)
        assert (problem is not None and "fix the destination" in problem) or bad == ""


def test_headers_nats_cannot_carry_are_the_rows_fault() -> None:
    assert header_problem({"trace": "ünï", "empty": ""}) is None
    for headers in ({"a b": "x"}, {"a:b": "x"}, {"ok": "line\nbreak"}, {"ünï": "x"}):
        error = header_problem(headers)
        assert error is not None and error.retryable is False
