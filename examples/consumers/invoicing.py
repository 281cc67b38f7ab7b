"""What both example consumers do with an ``OrderPlaced`` event: one invoice per order.

The invoice is written in the same transaction as the inbox claim (see ``kafka_consumer.py``
and ``rabbitmq_consumer.py``), so it is written exactly once however often the broker delivers
the event. Gaps and late arrivals in a customer's sequence numbers are reported here; what to
do about them is this consumer's business, not relayer's.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from relayer import Claim, Outcome

CONSUMER = "invoicing"  # the inbox keeps one set of claimed ids per consumer name
CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS invoices (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id uuid NOT NULL,
    customer_id text NOT NULL,
    quantity integer NOT NULL,
    message_id uuid NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""
INSERT_INVOICE = (
    "INSERT INTO invoices (order_id, customer_id, quantity, message_id) VALUES (%s, %s, %s, %s)"
)

logger = logging.getLogger("invoicing")


def invoice(body: bytes, claim: Claim) -> tuple[Any, ...]:
    """The invoice row of an OrderPlaced event (the parameters of INSERT_INVOICE)."""
    event = json.loads(body)
    return (event["id"], event["customer_id"], event["quantity"], claim.message_id)


def report(claim: Claim, key: str | None) -> None:
    """Log what was done with the message, and what its claim says about the key's sequence
    numbers when anything is off."""
    if claim:
        logger.info("customer %s: invoiced (message %s)", key, claim.message_id)
    if claim.outcome is Outcome.GAP:
        missing = claim.missing
        logger.warning(
            "customer %s: message %s arrived after %s; %s never arrived (lost, dropped by an "
            "operator, or still on the way)",
            key,
            claim.sequence,
            claim.previous,
            missing.start if len(missing) == 1 else f"{missing.start} to {missing.stop - 1}",
        )
    elif claim.outcome is Outcome.REORDERED:
        logger.warning(
            "customer %s: message %s arrived after %s (late, or a duplicate whose inbox entry "
            "expired)",
            key,
            claim.sequence,
            claim.previous,
        )
    elif claim.outcome is Outcome.DUPLICATE:
        logger.info("message %s was processed before; skipped", claim.message_id)
