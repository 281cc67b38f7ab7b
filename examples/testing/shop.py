"""A tiny order service: an order and its OrderPlaced event commit in one transaction."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from relayer import Outbox


def create_tables(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS orders "
        "(id text PRIMARY KEY, customer text NOT NULL, amount integer NOT NULL)"
    )
    conn.commit()


def place_order(
    conn: psycopg.Connection[Any], outbox: Outbox, order_id: str, customer: str, amount: int
) -> None:
    """Store the order and its event together, or neither (the amount must be positive)."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO orders (id, customer, amount) VALUES (%s, %s, %s)",
            (order_id, customer, amount),
        )
        event = {"type": "OrderPlaced", "id": order_id, "customer": customer, "amount": amount}
        outbox.write(
            conn, destination="orders.events", key=customer, body=json.dumps(event).encode()
        )
        if amount <= 0:
            raise ValueError(f"amount must be positive, not {amount}")
