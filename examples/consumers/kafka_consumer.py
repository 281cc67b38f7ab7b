"""Consume the order events relayer publishes to Kafka, invoicing each order exactly once.

Each message is handled in one PostgreSQL transaction that claims its id in relayer's inbox and
writes the invoice; its offset is committed only after that transaction committed. If the
process dies in between, Kafka delivers the message again and the inbox reports a duplicate.

    python kafka_consumer.py --bootstrap 127.0.0.1:9092 --topic orders.events

The inbox lives in the store named by ``--store`` (default ``billing``) of the relayer settings
(``RELAYER_CONFIG`` or ``RELAYER_*`` variables); see README.md.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

import psycopg
from confluent_kafka import Consumer
from invoicing import CONSUMER, CREATE_TABLE, INSERT_INVOICE, invoice, report

from relayer import Claim, Inbox, load_settings
from relayer.inbox import delivery_of

logger = logging.getLogger("kafka_consumer")


def handle(conn: psycopg.Connection[Any], inbox: Inbox, message: Any) -> Claim:
    """Process one confluent_kafka Message in one transaction; the claim says what it was."""
    with conn.transaction():
        claim = inbox.claim_message(conn, message, CONSUMER)
        if claim:
            conn.execute(INSERT_INVOICE, invoice(message.value(), claim))
    report(claim, delivery_of(message).key)
    return claim


def consume(
    consumer: Any,
    conn: psycopg.Connection[Any],
    inbox: Inbox,
    *,
    stop: threading.Event,
    limit: int | None = None,
) -> list[Claim]:
    """Handle messages until ``stop`` is set (or ``limit`` were handled); commit each offset
    after its transaction. Returns the claims, in order."""
    claims: list[Claim] = []
    while not stop.is_set() and (limit is None or len(claims) < limit):
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error() is not None:
            logger.warning("Kafka: %s", message.error())
            continue
        claims.append(handle(conn, inbox, message))
        consumer.commit(message=message, asynchronous=False)
    return claims


def _assigned(consumer: Any, partitions: list[Any]) -> None:
    numbers = ", ".join(str(partition.partition) for partition in partitions) or "none"
    logger.info("partitions assigned: %s; invoicing each order as it arrives", numbers)


def consumer_settings(bootstrap: str, group: str) -> dict[str, Any]:
    """The consumer's confluent-kafka settings."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,  # offsets are committed after the transaction
        "auto.offset.reset": "earliest",
        # A group's first assignment waits for up to the session timeout on some brokers (the
        # embedded one: 23 s with librdkafka's 45 s default, 3 s with 6 s), and a restarted
        # consumer's old membership holds its partitions that long.
        "session.timeout.ms": 6000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    parser.add_argument("--topic", default="orders.events")
    parser.add_argument("--group", default="invoicing", help="consumer group id")
    parser.add_argument("--store", default="billing", help="relayer store holding the inbox")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    store = load_settings().store(arguments.store)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    consumer = Consumer(consumer_settings(arguments.bootstrap, arguments.group))
    logger.info(
        "consuming %s on %s as group %s; waiting for partitions (Ctrl-C stops)",
        arguments.topic,
        arguments.bootstrap,
        arguments.group,
    )
    consumer.subscribe([arguments.topic], on_assign=_assigned)
    try:
        with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
            conn.execute(CREATE_TABLE)
            consume(consumer, conn, Inbox(store), stop=stop)
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
