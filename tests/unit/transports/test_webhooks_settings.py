"""The webhook transport's settings, signature and destinations, without a network."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from relayer.errors import ConfigurationError
from relayer.settings import TransportSettings
from relayer.transports.registry import create_transport
from relayer.transports.webhooks import WebhookTransport
from relayer.transports.webhooks.endpoints import DestinationProblem, Endpoints
from relayer.transports.webhooks.signing import Signer

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def build(**options: Any) -> Any:
    values = {"url": "https://hooks.example/in", "secret": SECRET, **options}
    return create_transport("orders", "hooks", TransportSettings(type="webhooks", **values))


def test_the_standard_webhooks_test_vector() -> None:
    # The example of the Standard Webhooks specification's reference libraries.
    signer = Signer("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    signature = signer.signature(
        "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
    )
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_a_valid_configuration_builds_a_transport() -> None:
    transport = build(max_concurrency="8", timeout="2.5")
    assert isinstance(transport, WebhookTransport)
    assert transport.name == "hooks"
    assert transport.pipelines_within_key is False


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"url": None}, "url", "is required"),
        ({"url": "ftp://hooks.example/"}, "url", "http:// or https://"),
        ({"url": "https:///no-host"}, "url", "with a host"),
        ({"url": "https://hooks.example/in?a=1"}, "url", "no query"),
        ({"secret": None}, "secret", "is required"),
        ({"secret": "not-whsec"}, "secret", "whsec_"),
        ({"secret": "whsec_!!!"}, "secret", "base64"),
        ({"secret": "whsec_" + base64.b64encode(b"short").decode()}, "secret", "24-64 byte"),
        ({"max_concurrency": 0}, "max_concurrency", "from 1"),
        ({"timeout": "soon"}, "timeout", "seconds"),
        ({"content_type": "text/plain\r\nx: y"}, "content_type", "media type"),
        ({"retries": 3}, "retries", "known options: url, secret"),
    ],
)
def test_bad_settings_name_the_field_the_value_and_the_rule(
    options: dict[str, Any], field: str, words: str
) -> None:
    values = {key: value for key, value in options.items() if value is not None}
    removed = [key for key, value in options.items() if value is None]
    full = {"url": "https://hooks.example/in", "secret": SECRET, **values}
    for key in removed:
        full.pop(key)
    with pytest.raises(ConfigurationError) as caught:
        create_transport("orders", "hooks", TransportSettings(type="webhooks", **full))
    text = str(caught.value)
    assert caught.value.field == f"stores.orders.transports.hooks.{field}"
    assert words in text
    assert "\n" not in text


def test_the_secret_never_shows() -> None:
    bad = "whsec_" + base64.b64encode(b"tiny-but-private").decode()
    with pytest.raises(ConfigurationError) as caught:
        build(secret=bad)
    assert bad not in str(caught.value)
    assert "***" in str(caught.value)
    transport = build(url="https://user:hunter2@hooks.example/in")
    assert SECRET not in repr(transport)
    assert "hunter2" not in repr(transport)
    assert "k" * 8 not in repr(Signer(SECRET))


@pytest.mark.parametrize(
    ("destination", "url"),
    [
        ("", "https://hooks.example/in"),
        ("orders", "https://hooks.example/in/orders"),
        ("/orders/paid", "https://hooks.example/in/orders/paid"),
        ("orders?tenant=7&x=%20", "https://hooks.example/in/orders?tenant=7&x=%20"),
    ],
)
def test_destinations_are_paths_under_the_url(destination: str, url: str) -> None:
    assert Endpoints("https://hooks.example/in/").resolve(destination) == url


@pytest.mark.parametrize(
    ("destination", "words"),
    [
        ("https://elsewhere.example/x", "whole URL"),
        ("orders/../../admin", "'..' segment"),
        ("./orders", "'.' or '..'"),
        ("orders paid", "cannot carry unescaped"),
        ("orders/%zz", "cannot carry unescaped"),
        ("x" * 3000, "over 2,048 characters"),
    ],
)
def test_destinations_that_would_leave_the_url_are_refused(destination: str, words: str) -> None:
    with pytest.raises(DestinationProblem) as caught:
        Endpoints("https://hooks.example/in").resolve(destination)
    assert words in str(caught.value)
    assert "fix the destination" in str(caught.value)
