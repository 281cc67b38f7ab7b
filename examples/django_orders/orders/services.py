"""Placing an order: the order and its OrderPlaced event in one Django transaction."""

from __future__ import annotations

import json

from django.conf import settings
from django.db import connection, transaction

from orders.models import Order
from relayer import Outbox

outbox = Outbox(settings.RELAYER)


def place_order(customer: str, amount: int) -> Order:
    """Both or neither: an amount of 0 is refused after the writes, which rolls both back."""
    with transaction.atomic():
        order = Order.objects.create(customer=customer, amount=amount)
        event = {"type": "OrderPlaced", "id": order.pk, "customer": customer, "amount": amount}
        # Django's connection: the row joins the atomic block's transaction.
        outbox.write(
            connection, destination="orders.events", key=customer, body=json.dumps(event).encode()
        )
        if amount <= 0:
            raise ValueError(f"amount must be positive, not {amount}")
    return order
