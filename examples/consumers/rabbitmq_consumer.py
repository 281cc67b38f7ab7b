"""Consume the order events relayer publishes to a RabbitMQ queue, invoicing each order once.

Each message is handled in one PostgreSQL transaction that claims its id in relayer's inbox and
writes the invoice; the message is acknowledged only after that transaction committed. If the
process dies in between, RabbitMQ delivers the message again and the inbox reports a duplicate.

    python rabbitmq_consumer.py --url amqp://guest:guest@127.0.0.1:5672/ --queue orders.events

The inbox lives in the store named by ``--store`` (default ``billing``) of the relayer settings
(``RELAYER_CONFIG`` or ``RELAYER_*`` variables); see README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from typing import Any

import aio_pika
import psycopg
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from invoicing import CONSUMER, CREATE_TABLE, INSERT_INVOICE, invoice, report

from relayer import Claim, Inbox, load_settings
from relayer.inbox import delivery_of


async def handle(
    conn: psycopg.AsyncConnection[Any], inbox: Inbox, message: AbstractIncomingMessage
) -> Claim:
    """Process one aio-pika message in one transaction; the claim says what it was."""
    async with conn.transaction():
        claim = await inbox.claim_message_async(conn, message, CONSUMER)
        if claim:
            await conn.execute(INSERT_INVOICE, invoice(message.body, claim))
    report(claim, delivery_of(message).key)
    return claim


async def consume(
    queue: AbstractQueue,
    conn: psycopg.AsyncConnection[Any],
    inbox: Inbox,
    *,
    limit: int | None = None,
) -> list[Claim]:
    """Handle messages (until cancelled, or ``limit`` were handled), acknowledging each after
    its transaction. An error or a cancellation leaves the message unacknowledged: RabbitMQ
    delivers it again once this consumer's channel is closed."""
    claims: list[Claim] = []
    async with queue.iterator() as messages:
        async for message in messages:
            claims.append(await handle(conn, inbox, message))
            await message.ack()
            if limit is not None and len(claims) >= limit:
                break
    return claims


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--queue", default="orders.events")
    parser.add_argument("--store", default="billing", help="relayer store holding the inbox")
    arguments = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    store = load_settings().store(arguments.store)
    connection = await aio_pika.connect(arguments.url)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=100)
        queue = await channel.declare_queue(arguments.queue, durable=True)
        async with await psycopg.AsyncConnection.connect(
            store.require_dsn(), autocommit=True
        ) as conn:
            await conn.execute(CREATE_TABLE)
            consuming = asyncio.ensure_future(consume(queue, conn, Inbox(store)))
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, consuming.cancel)
            with contextlib.suppress(asyncio.CancelledError):
                await consuming
    finally:
        await connection.close()


if __name__ == "__main__":
    asyncio.run(main())
