"""RabbitMQ destination syntax."""

from __future__ import annotations

import pytest

from relayer.transports.rabbitmq.routes import Route, RouteError, parse_route


@pytest.mark.parametrize(
    ("destination", "exchange", "routing_key", "by_key"),
    [
        ("/orders", "", "orders", False),
        ("events/order.paid", "events", "order.paid", False),
        ("events/a/b", "events", "a/b", False),
        ("events.hash/{key}", "events.hash", "", True),
        ("events.fanout", "events.fanout", "", False),
        ("events/", "events", "", False),
    ],
)
def test_destinations(destination: str, exchange: str, routing_key: str, by_key: bool) -> None:
    route = parse_route(destination)
    assert route == Route(destination, exchange, routing_key, by_key)


def test_queue_and_key_routing() -> None:
    assert parse_route("/orders").queue == "orders"
    assert parse_route("events/x").queue is None
    assert parse_route("events.hash/{key}").routing_key_for("customer-7") == "customer-7"
    assert parse_route("events.hash/{key}").routing_key_for(None) == ""
    assert parse_route("events/x").routing_key_for("customer-7") == "x"
    with pytest.raises(RouteError, match="longer than 255 bytes"):
        parse_route("events.hash/{key}").routing_key_for("k" * 300)


@pytest.mark.parametrize(
    ("destination", "words"),
    [
        ("", "is empty"),
        ("/", "names no queue"),
        ("/{key}", "default exchange"),
        ("amq.default/x", "write '/queue'"),
        ("e" * 256 + "/x", "longer than 255 bytes"),
    ],
)
def test_bad_destinations_explain_the_syntax(destination: str, words: str) -> None:
    with pytest.raises(RouteError) as caught:
        parse_route(destination)
    assert words in str(caught.value)
    assert "'exchange/routing-key'" in str(caught.value)
