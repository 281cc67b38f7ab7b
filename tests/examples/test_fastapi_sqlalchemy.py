"""The FastAPI example through its HTTP API against real PostgreSQL and Kafka.

A placed order commits with its ordered event (left for the workers) and its confirmation,
which the app itself sends to Kafka right after the commit; a refused order (no stock) leaves
neither the order nor any message behind.
"""

from __future__ import annotations

import asyncio
import json
import time
import warnings
from typing import Any

import psycopg
from orders_service import create_app

from relayer.settings import StoreSettings
from tests.conftest import apply_schema, make_store
from tests.contract.brokers import consume_kafka, create_topics, unique

with warnings.catch_warnings():
    # Starlette's TestClient now prefers the httpx2 package; httpx still works.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient


def rows(store: StoreSettings, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(store.require_dsn()) as conn:
        return conn.execute(query).fetchall()


def outbox(store: StoreSettings) -> list[tuple[Any, ...]]:
    return rows(store, "SELECT ordering_key, destination, body FROM orders_outbox ORDER BY id")


async def test_an_order_commits_with_its_messages_and_a_refused_one_leaves_nothing(
    pg_dsn: str, kafka_bootstrap: str
) -> None:
    events, confirmations = unique("events"), unique("confirmations")
    await asyncio.to_thread(create_topics, kafka_bootstrap, [confirmations], 1)
    store = make_store(
        pg_dsn,
        transports={"kafka": {"type": "kafka", "bootstrap.servers": kafka_bootstrap}},
        default_transport="kafka",
    )
    await apply_schema(store)
    app = create_app(store, events=events, confirmations=confirmations)
    await asyncio.to_thread(place_orders, app, store)

    [(key, destination, body)] = outbox(store)  # the confirmation went out after the commit
    event = json.loads(body)
    assert (key, destination) == ("customer-7", events)
    assert event["type"] == "OrderPlaced"
    assert rows(store, "SELECT id::text, customer_id, quantity FROM orders") == [
        (event["id"], "customer-7", 2)
    ]
    assert rows(store, "SELECT stock FROM products") == [(1,)]
    [confirmation] = await asyncio.to_thread(consume_kafka, kafka_bootstrap, confirmations, 1)
    assert json.loads(confirmation.body) == {"order_id": event["id"], "customer_id": "customer-7"}


def place_orders(app: Any, store: StoreSettings) -> None:
    with TestClient(app) as client:  # runs the lifespan: tables, dispatcher
        with psycopg.connect(store.require_dsn()) as conn:
            conn.execute("INSERT INTO products (id, stock) VALUES ('book', 3)")
            conn.commit()
        placed = client.post(
            "/orders", json={"customer_id": "customer-7", "product_id": "book", "quantity": 2}
        )
        assert placed.status_code == 201, placed.text
        refused = client.post(
            "/orders", json={"customer_id": "customer-8", "product_id": "book", "quantity": 2}
        )
        assert refused.status_code == 409
        assert refused.json() == {"detail": "not enough stock of 'book'"}
        invalid = client.post("/orders", json={"customer_id": "", "product_id": "book"})
        assert invalid.status_code == 422
        deadline = time.monotonic() + 30
        while any(key is None for key, _, _ in outbox(store)):  # the dispatch after commit
            assert time.monotonic() < deadline, outbox(store)
            time.sleep(0.05)
