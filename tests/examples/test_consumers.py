"""The example consumers against real messages that relayer relayed to Kafka and RabbitMQ.

The producing store numbers each customer's events; one event is lost (an operator's drop)
before the relay sends them. Each consumer invoices every order it receives once, reports the
gap, skips a redelivered duplicate, and commits the offset (Kafka) or acknowledges the message
(RabbitMQ) only after its transaction.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import kafka_consumer
import psycopg
import pytest
import rabbitmq_consumer
from invoicing import CREATE_TABLE

from relayer import Claim, Inbox, Outbox, OutboxMessage, Outcome
from relayer.settings import StoreSettings
from tests.conftest import apply_schema, make_store
from tests.contract.brokers import create_topics, unique
from tests.examples.conftest import EXAMPLES
from tests.examples.documented import environment, wait_until
from tests.integration.inbox.test_brokers import consume_kafka_messages, relay, relayed_store

GAP_LOG = (
    "customer customer-1: message 3 arrived after 1; 2 never arrived (lost, dropped by an "
    "operator, or still on the way)"
)


def write_orders(store: StoreSettings, destination: str) -> None:
    """customer-1's orders 1, 2 and 3 and customer-2's 1 and 2; customer-1's 2nd is lost."""
    messages = [
        OutboxMessage(
            destination,
            json.dumps({"id": str(uuid.uuid4()), "customer_id": key, "quantity": number}).encode(),
            key=key,
        )
        for number in (1, 2, 3)
        for key in ("customer-1", "customer-2")
        if (key, number) != ("customer-2", 3)
    ]
    with psycopg.connect(store.require_dsn()) as conn:
        ids = Outbox(store).write_many(conn, messages)
        conn.execute(f"DELETE FROM {store.table_prefix}outbox WHERE id = %s", (ids[2],))
        conn.commit()


async def billing_store(dsn: str) -> StoreSettings:
    """The consumer's own store (its inbox), here in the same database under another prefix."""
    store = make_store(dsn, name="billing", table_prefix="billing_")
    await apply_schema(store)
    with psycopg.connect(dsn) as conn:
        conn.execute(CREATE_TABLE)
        conn.commit()
    return store


def invoices(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT customer_id, quantity FROM invoices ORDER BY 1, 2").fetchall()
    return [(row[0], row[1]) for row in rows]


EXPECTED_INVOICES = [("customer-1", 1), ("customer-1", 3), ("customer-2", 1), ("customer-2", 2)]


async def test_kafka_consumer_invoices_once_and_reports_the_gap(
    pg_dsn: str, kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    from confluent_kafka import Consumer, TopicPartition

    caplog.set_level(logging.INFO, logger="invoicing")
    topic, group = unique("orders"), unique("invoicing")
    await asyncio.to_thread(create_topics, kafka_bootstrap, [topic], 2)
    producing = await relayed_store(pg_dsn, {"type": "kafka", "bootstrap.servers": kafka_bootstrap})
    write_orders(producing, topic)
    await relay(producing)
    billing = await billing_store(pg_dsn)

    def run_consumer() -> tuple[list[Claim], list[Any], list[Any]]:
        consumer = Consumer(kafka_consumer.consumer_settings(kafka_bootstrap, group))
        partitions = [TopicPartition(topic, number) for number in (0, 1)]
        consumer.assign(partitions)
        try:
            with psycopg.connect(billing.require_dsn(), autocommit=True) as conn:
                claims = kafka_consumer.consume(
                    consumer, conn, Inbox(billing), stop=threading.Event(), limit=4
                )
            positions = consumer.position(partitions)
            committed = consumer.committed(partitions, timeout=10)
        finally:
            consumer.close()
        return claims, positions, committed

    claims, positions, committed = await asyncio.to_thread(run_consumer)
    assert sorted(claim.outcome for claim in claims) == sorted(
        [Outcome.IN_ORDER, Outcome.GAP, Outcome.IN_ORDER, Outcome.IN_ORDER]
    )
    [gap] = [claim for claim in claims if claim.outcome is Outcome.GAP]
    assert (gap.previous, gap.sequence, list(gap.missing)) == (1, 3, [2])
    assert GAP_LOG in caplog.messages
    assert [(p.partition, p.offset) for p in committed] == [
        (p.partition, p.offset) for p in positions
    ]
    assert invoices(pg_dsn) == EXPECTED_INVOICES

    # A consumer that restarts before committing its offsets reads everything again.
    again = await asyncio.to_thread(consume_kafka_messages, kafka_bootstrap, topic, 4)
    with psycopg.connect(billing.require_dsn(), autocommit=True) as conn:
        repeats = [kafka_consumer.handle(conn, Inbox(billing), message) for message in again]
    assert {claim.outcome for claim in repeats} == {Outcome.DUPLICATE}
    assert invoices(pg_dsn) == EXPECTED_INVOICES


async def test_rabbitmq_consumer_invoices_once_and_acks_after_commit(
    pg_dsn: str, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    import aio_pika

    caplog.set_level(logging.INFO, logger="invoicing")
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(unique("orders"), durable=True)
        producing = await relayed_store(pg_dsn, {"type": "rabbitmq", "url": rabbitmq_url})
        write_orders(producing, "/" + queue.name)
        await relay(producing)
        billing = await billing_store(pg_dsn)
        async with await psycopg.AsyncConnection.connect(
            billing.require_dsn(), autocommit=True
        ) as conn:
            # The first delivery is processed, then the consumer dies before its ack.
            first = await queue.get(timeout=10)
            assert first is not None
            claim = await rabbitmq_consumer.handle(conn, Inbox(billing), first)
            assert claim.outcome is Outcome.IN_ORDER
            await first.reject(requeue=True)
            claims = await rabbitmq_consumer.consume(queue, conn, Inbox(billing), limit=4)
        left = await channel.declare_queue(queue.name, passive=True)
        assert left.declaration_result.message_count == 0  # all acknowledged
        await queue.delete()
    finally:
        await connection.close()
    outcomes = [claim.outcome for claim in claims]
    assert sorted(outcomes) == sorted(
        [Outcome.DUPLICATE, Outcome.GAP, Outcome.IN_ORDER, Outcome.IN_ORDER]
    )
    assert GAP_LOG in caplog.messages
    assert f"message {claim.message_id} was processed before; skipped" in caplog.messages
    assert invoices(pg_dsn) == EXPECTED_INVOICES


def test_kafka_consumer_says_what_it_waits_for_before_any_message(
    tmp_path: Path, pg_dsn: str, kafka_bootstrap: str
) -> None:
    """Started before anything is published, the consumer says at once what it consumes, then
    when its group has assigned it partitions: it used to print nothing until the first message
    (the group's first assignment alone took 23 s on the embedded broker)."""
    topic, group = unique("orders"), unique("invoicing")
    create_topics(kafka_bootstrap, [topic], 2)
    config = tmp_path / "billing.toml"
    config.write_text(f'[stores.billing]\ndsn = {json.dumps(pg_dsn)}\nschema = "billing"\n')
    log = tmp_path / "consumer.log"
    script = EXAMPLES / "consumers" / "kafka_consumer.py"
    command = [sys.executable, str(script), "--bootstrap", kafka_bootstrap, "--topic", topic]
    with log.open("w") as output:
        consumer = subprocess.Popen(
            [*command, "--group", group],
            env=environment(RELAYER_CONFIG=str(config)),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(lambda: "partitions assigned: 0, 1" in log.read_text(), "the assignment")
        finally:
            consumer.send_signal(signal.SIGTERM)
            status = consumer.wait(60)
    lines = log.read_text().splitlines()
    assert f"consuming {topic} on {kafka_bootstrap} as group {group}" in lines[0]
    assert "waiting for partitions (Ctrl-C stops)" in lines[0]
    assert status == 0, lines
    # The group's first assignment waits up to the session timeout on some brokers.
    assert kafka_consumer.consumer_settings(kafka_bootstrap, "g")["session.timeout.ms"] <= 10_000
