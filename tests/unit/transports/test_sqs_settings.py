"""The SQS transport's settings and what an outbox row becomes in a batch, without a network."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from relayer.errors import ConfigurationError
from relayer.settings import TransportSettings
from relayer.transports.base import SendError
from relayer.transports.registry import create_transport
from relayer.transports.sqs import SQSTransport
from relayer.transports.sqs.encoding import body_text, entry, group_id


def build(**options: Any) -> Any:
    return create_transport("orders", "queue", TransportSettings(type="sqs", **options))


def test_a_valid_configuration_builds_a_transport() -> None:
    transport = build(region="eu-west-1", max_outstanding="200", queues="a.fifo, b")
    assert isinstance(transport, SQSTransport)
    assert transport.pipelines_within_key is False


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({}, "region", "is required"),
        ({"region": "eu-west-1", "endpoint_url": "localhost:4566"}, "endpoint_url", "http://"),
        ({"region": "eu-west-1", "access_key_id": "AKIA1"}, "access_key_id", "both"),
        ({"region": "eu-west-1", "max_outstanding": 0}, "max_outstanding", "from 1"),
        ({"region": "eu-west-1", "timeout": "-1"}, "timeout", "greater than 0"),
        ({"region": "eu-west-1", "batch": 5}, "batch", "known options: region"),
    ],
)
def test_bad_settings_name_the_field_the_value_and_the_rule(
    options: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        build(**options)
    assert caught.value.field == f"stores.orders.transports.queue.{field}"
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_credentials_never_show() -> None:
    with pytest.raises(ConfigurationError) as caught:
        build(region="eu-west-1", secret_access_key="wJalrXUtnFEMI/K7MDENG")
    assert "wJalrXUtnFEMI" not in str(caught.value)
    transport = build(
        region="eu-west-1",
        access_key_id="AKIAEXAMPLE",
        secret_access_key="wJalrXUtnFEMI/K7MDENG",
        endpoint_url="https://user:hunter2@sqs.example",
    )
    assert "wJalrXUtnFEMI" not in repr(transport)
    assert "hunter2" not in repr(transport)


@pytest.mark.parametrize(
    ("body", "text", "encoding"),
    [
        (b'{"n": 1}', '{"n": 1}', None),
        ("ünïcödé ✓".encode(), "ünïcödé ✓", None),
        (b"\xff\x00\xfe", base64.b64encode(b"\xff\x00\xfe").decode(), "base64"),
        (b"nul \x00 inside", base64.b64encode(b"nul \x00 inside").decode(), "base64"),
        (b"", "-", "empty"),
    ],
)
def test_bodies_sqs_cannot_carry_as_text_go_in_base64(
    body: bytes, text: str, encoding: str | None
) -> None:
    assert body_text(body) == (text, encoding)


def test_keys_sqs_refuses_as_group_ids_are_hashed_consistently() -> None:
    assert group_id("order-42/eu") == "order-42/eu"
    hashed = group_id("clé avec espaces")
    assert hashed.startswith("relayer-") and len(hashed) <= 128
    assert group_id("clé avec espaces") == hashed
    assert group_id("x" * 200) != group_id("x" * 201)


def test_an_entry_carries_the_id_the_key_and_the_headers() -> None:
    built, size = entry(
        "0190-id", "k", b"body", {"trace": "ünï", "empty": ""}, fifo=True, max_bytes=262_144
    )
    assert built["MessageDeduplicationId"] == "0190-id"
    assert built["MessageGroupId"] == "k"
    attributes = {name: value["StringValue"] for name, value in built["MessageAttributes"].items()}
    assert attributes["relayer-message-id"] == "0190-id"
    assert attributes["relayer-ordering-key"] == "k"
    assert json.loads(attributes["relayer-headers"]) == {"trace": "ünï", "empty": ""}
    assert size > len("body")
    unordered, _ = entry("0190-id", None, b"body", None, fifo=True, max_bytes=262_144)
    assert unordered["MessageGroupId"] == "0190-id"
    standard, _ = entry("0190-id", None, b"body", None, fifo=False, max_bytes=262_144)
    assert "MessageGroupId" not in standard and "MessageDeduplicationId" not in standard


def test_a_message_over_the_queues_size_is_the_rows_fault() -> None:
    with pytest.raises(SendError) as caught:
        entry("id", "k", b"x" * 2_000, None, fifo=True, max_bytes=1_024)
    assert not caught.value.retryable
    assert "MaximumMessageSize of 1,024" in str(caught.value)
