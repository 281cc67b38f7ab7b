"""Rows already in the outbox that the relay cannot send, against the real brokers.

All keys share one lane. Each bad key (too large for the broker, a topic, queue or exchange
that does not exist, a name the broker refuses, a header RabbitMQ cannot carry, a transport the
worker does not have, a destination without per-key order) parks alone with a message saying
what to fix; its later rows wait behind it. Every other row reaches its consumer, in order per
key, and nothing is lost: the parked keys' rows are all still in the outbox.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
import pytest

from relayer import Outbox, OutboxMessage
from relayer.redact import redact
from relayer.settings import StoreSettings, WorkerSettings
from relayer.worker import Worker
from tests.acceptance.cli import command, environment, relayer
from tests.badinput.support import SECRETS, with_password
from tests.conftest import apply_schema, make_store
from tests.contract.brokers import consume_kafka, consume_rabbitmq, create_topics, unique
from tests.integration.relay.helpers import parked, pending

GOOD_KEYS = [f"customer-{number}" for number in range(4)]
STORE_SETTINGS: dict[str, Any] = {
    "lanes": 1,  # every key in one lane: a bad key must not hold up its neighbours
    "lease_duration": "6s",
    "poll_interval": "0.2s",
    "max_attempts": 1,  # the first failure waits for an operator: a final state to check
    "unordered_grace": "0s",
    "maintenance_interval": "0.2s",
    "retry_backoff_max": "1h",
}


async def broker_store(pg_dsn: str, transport: dict[str, Any]) -> StoreSettings:
    store = make_store(
        with_password(pg_dsn),
        transports={"broker": transport},
        default_transport="broker",
        **STORE_SETTINGS,
    )
    await apply_schema(store)
    return store


def write_rows(store: StoreSettings, good: str, bad: dict[str, OutboxMessage]) -> None:
    """Three rows per good key; per bad key its bad row then a good-looking one behind it."""
    messages = [
        OutboxMessage(good, f"{key}#{number}".encode(), key=key)
        for number in range(3)
        for key in GOOD_KEYS
    ]
    for key, first in bad.items():
        messages += [first, OutboxMessage(good, f"{key}#1".encode(), key=key)]
    with psycopg.connect(store.require_dsn()) as conn:
        Outbox(store).write_many(conn, messages)
        # A row naming a transport this store does not configure (written by another service).
        conn.execute(
            "INSERT INTO orders_outbox (id, lane, ordering_key, transport, destination, body) "
            "VALUES (gen_random_uuid(), 0, 'unknown-transport', 'sqs', 'events', 'x')"
        )
        conn.commit()


def in_order(bodies: list[bytes]) -> dict[str, list[int]]:
    """key -> numbers in arrival order."""
    found: dict[str, list[int]] = {}
    for body in bodies:
        key, number = body.decode().rsplit("#", 1)
        found.setdefault(key, []).append(int(number))
    return found


def errors(store: StoreSettings) -> dict[str, str]:
    """Every parked key's error, after checking each waits for an operator."""
    found = parked(store)
    assert all(waiting for _, _, waiting in found.values()), found
    return {key: error for key, (_, error, _) in found.items()}


def unordered_errors(store: StoreSettings) -> list[str]:
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute(
            "SELECT coalesce(last_error, '') FROM orders_outbox WHERE ordering_key IS NULL"
        ).fetchall()
    return [row[0] for row in rows]


async def wait_for(condition: Callable[[], bool], within: float = 30) -> None:
    async with asyncio.timeout(within):
        while not await asyncio.to_thread(condition):
            await asyncio.sleep(0.1)


UNKNOWN_TRANSPORT = (
    "transport 'sqs' is not configured for store 'orders' (configured: 'broker'); add "
    "[stores.orders.transports.sqs] and restart the workers, or drop the key"
)
RETRIED = "once that is fixed, the key's next retry sends it (or redrive it)"


async def test_kafka_parks_each_bad_key_through_relayer_run(
    pg_dsn: str, kafka_bootstrap: str
) -> None:
    topic, missing = unique("badinput"), unique("missing")
    await asyncio.to_thread(create_topics, kafka_bootstrap, [topic], 2)
    store = await broker_store(pg_dsn, {"type": "kafka", "bootstrap.servers": kafka_bootstrap})
    bad = {
        "too-large": OutboxMessage(topic, b"x" * 1_100_000, key="too-large"),
        "missing-topic": OutboxMessage(missing, b"{}", key="missing-topic"),
        "invalid-topic": OutboxMessage("no such topic!", b"{}", key="invalid-topic"),
    }
    write_rows(store, topic, bad)
    with psycopg.connect(store.require_dsn()) as conn:
        outbox = Outbox(store)
        outbox.write(conn, destination=topic, body=b"unordered#0")
        outbox.write(conn, destination=missing, body=b"unordered#1")
        conn.commit()
    env = environment(
        store,
        **{
            f"RELAYER_STORES__ORDERS__{name.upper()}": str(value)
            for name, value in STORE_SETTINGS.items()
            if name != "lanes"
        },
        RELAYER_STORES__ORDERS__TRANSPORTS__BROKER__TYPE="kafka",
        RELAYER_STORES__ORDERS__TRANSPORTS__BROKER__BOOTSTRAP_SERVERS=kafka_bootstrap,
        RELAYER_STORES__ORDERS__DEFAULT_TRANSPORT="broker",
    )
    worker = await asyncio.to_thread(
        partial(subprocess.Popen, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        command("run", "orders"),
        env=env,
    )
    try:
        await wait_for(
            lambda: len(parked(store)) == 4 and pending(store) == 8 and all(unordered_errors(store))
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.to_thread(worker.communicate, timeout=30)
    assert worker.returncode == 0, stderr
    for secret in SECRETS:
        assert secret not in stdout + stderr

    missing_text = (
        f"Kafka topic {missing!r} does not exist; create it (e.g. kafka-topics.sh --create "
        f"--topic {missing}) or fix the destination"
    )
    found = errors(store)
    too_large = found.pop("too-large")  # librdkafka's own words in the middle
    assert too_large.startswith(
        f"Kafka refused a 1,100,000-byte message for topic {topic!r} as too large "
        "(MSG_SIZE_TOO_LARGE: "
    )
    assert too_large.endswith(
        "); shrink the body, or raise the producer's message.max.bytes (now 1,000,000) together "
        "with the topic's max.message.bytes and the broker's message.max.bytes"
    )
    assert found == {
        "missing-topic": f"cannot check destination {missing!r} of transport 'broker': "
        f"{missing_text}; {RETRIED}",
        "invalid-topic": "cannot check destination 'no such topic!' of transport 'broker': "
        f"'no such topic!' is not a valid Kafka topic name; fix the destination; {RETRIED}",
        "unknown-transport": UNKNOWN_TRANSPORT,
    }
    assert unordered_errors(store) == [missing_text]  # unordered rows are retried, never parked
    # The worker has stopped: everything it sent is in the topic; read until it stays idle.
    received = await asyncio.to_thread(consume_kafka, kafka_bootstrap, topic, 14, 1.0)
    delivered = in_order([message.body for message in received])
    assert delivered == {**{key: [0, 1, 2] for key in GOOD_KEYS}, "unordered": [0]}

    listed = await asyncio.to_thread(relayer, "parked", "list", "orders", env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("waiting for an operator") == 4


async def test_rabbitmq_parks_each_bad_key_through_a_worker(
    pg_dsn: str, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    import aio_pika

    caplog.set_level(logging.INFO, logger="relayer")
    unbound, missing_exchange, missing_queue = unique("unbound"), unique("nox"), unique("noq")
    connection = await aio_pika.connect(rabbitmq_url)
    channel = await connection.channel()
    queue = await channel.declare_queue(unique("badinput"), durable=True)
    good = "/" + queue.name
    transport = {
        "type": "rabbitmq",
        "url": rabbitmq_url,
        "ordered_destinations": [f"amq.direct/{unbound}", "amq.topic/{key}"],
    }
    store = await broker_store(pg_dsn, transport)
    long_key, long_header = "k" * 300, "h" * 200
    bad = {
        "missing-exchange": OutboxMessage(f"{missing_exchange}/rk", b"{}", key="missing-exchange"),
        "missing-queue": OutboxMessage(f"/{missing_queue}", b"{}", key="missing-queue"),
        "not-ordered": OutboxMessage("amq.direct/rk", b"{}", key="not-ordered"),
        "unroutable": OutboxMessage(f"amq.direct/{unbound}", b"{}", key="unroutable"),
        long_key: OutboxMessage("amq.topic/{key}", b"{}", key=long_key),
        "long-header": OutboxMessage(good, b"{}", key="long-header", headers={long_header: "v"}),
    }
    write_rows(store, good, bad)
    with psycopg.connect(store.require_dsn()) as conn:
        outbox = Outbox(store)
        outbox.write(conn, destination=good, body=b"unordered#0")
        outbox.write(conn, destination=f"{missing_exchange}/rk", body=b"unordered#1")
        conn.commit()
    worker = Worker([store], settings=WorkerSettings(pool_size=2))
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        await wait_for(
            lambda: (
                len(parked(store)) == 7 and pending(store) == 14 and all(unordered_errors(store))
            )
        )
        received = await consume_rabbitmq(connection, queue.name, 13)
        left = await channel.declare_queue(queue.name, passive=True)
        assert left.declaration_result.message_count == 0  # nothing else arrived
    finally:
        stop.set()
        await running
        await queue.delete()
        await connection.close()
    assert in_order([message.body for message in received]) == {
        **{key: [0, 1, 2] for key in GOOD_KEYS},
        "unordered": [0],
    }

    nox = (
        f"RabbitMQ exchange {missing_exchange!r} does not exist (destination "
        f"'{missing_exchange}/rk'); declare the exchange or fix the destination"
    )
    assert errors(store) == {
        "missing-exchange": f"cannot check destination '{missing_exchange}/rk' of transport "
        f"'broker': {nox}; {RETRIED}",
        "missing-queue": f"cannot check destination '/{missing_queue}' of transport 'broker': "
        f"RabbitMQ queue {missing_queue!r} does not exist (destination '/{missing_queue}'); "
        f"declare the queue or fix the destination; {RETRIED}",
        "not-ordered": "destination 'amq.direct/rk' of transport 'broker' does not keep per-key "
        "order natively, so ordered rows cannot be sent to it; send them to a destination that "
        "does (see docs/transports.md), then redrive the key",
        "unroutable": "RabbitMQ returned the message as unroutable: no queue is bound to "
        f"exchange 'amq.direct' for routing key {unbound!r} (destination "
        f"'amq.direct/{unbound}'); bind a queue or fix the destination",
        long_key: f"the ordering key {long_key[:40]!r}... is longer than 255 bytes and cannot "
        "be the routing key of destination 'amq.topic/{key}'; use shorter keys or a fixed "
        "routing key with a hash-header exchange",
        "long-header": f"header name {long_header[:40]!r}... is 200 bytes; AMQP header names "
        "are at most 128 bytes and RabbitMQ would receive it cut short; write the row with a "
        "shorter header name",
        "unknown-transport": UNKNOWN_TRANSPORT,
    }
    assert unordered_errors(store) == [nox]
    assert redact(rabbitmq_url) in caplog.text  # the start-up line names the broker...
    assert rabbitmq_url not in caplog.text  # ...without its password
