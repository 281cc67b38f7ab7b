"""The order service's tests, with relayer's pytest fixtures."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
from shop import place_order

from relayer import Outbox
from relayer.testing import RecordingTransport, Relay


def test_a_placed_order_sends_its_event(
    conn: psycopg.Connection[Any],
    relayer_outbox: Outbox,
    relayer_relay: Relay,
    relayer_transport: RecordingTransport,
) -> None:
    place_order(conn, relayer_outbox, "o-1", "customer-7", 30)
    place_order(conn, relayer_outbox, "o-2", "customer-7", 12)

    drained = relayer_relay.drain()  # what the workers would do, once, right here

    assert drained.sent == 2
    first, second = relayer_transport.assert_sent("orders.events", key="customer-7", count=2)
    assert [json.loads(first.body)["id"], json.loads(second.body)["id"]] == ["o-1", "o-2"]


def test_a_refused_order_sends_nothing(
    conn: psycopg.Connection[Any],
    relayer_outbox: Outbox,
    relayer_relay: Relay,
    relayer_transport: RecordingTransport,
) -> None:
    with pytest.raises(ValueError, match="amount must be positive"):
        place_order(conn, relayer_outbox, "o-3", "customer-8", 0)

    assert relayer_relay.drain().sent == 0
    relayer_transport.assert_nothing_sent()
    assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)


def test_a_broker_that_refuses_parks_the_customers_events(
    conn: psycopg.Connection[Any],
    relayer_outbox: Outbox,
    relayer_relay: Relay,
    relayer_transport: RecordingTransport,
) -> None:
    relayer_transport.fail_key("customer-9", retryable=False, message="topic is read-only")
    place_order(conn, relayer_outbox, "o-4", "customer-9", 5)
    place_order(conn, relayer_outbox, "o-5", "customer-1", 5)

    drained = relayer_relay.drain()

    assert (drained.sent, drained.failed) == (1, 1)
    relayer_transport.assert_sent(key="customer-1", count=1)
    assert relayer_transport.sent(key="customer-9") == []  # parked: waits for its retry
