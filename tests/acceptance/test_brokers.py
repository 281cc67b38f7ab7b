"""Three ``relayer run orders`` processes relay 50,000 rows over 1,000 keys to a real broker;
a consumer reads everything back and checks I1 (all delivered), I2 (per-key order of first
deliveries) and I4 (the outbox drains)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg
import pytest

from relayer import Outbox, OutboxMessage
from relayer.settings import StoreSettings
from tests.acceptance.cli import command, environment
from tests.conftest import apply_schema, make_store
from tests.contract.brokers import (
    Received,
    consume_kafka,
    consume_rabbitmq,
    create_topics,
    unique,
)
from tests.integration.relay.helpers import pending

ROWS = 50_000
KEYS = 1_000
WORKERS = 3


def config_file(tmp_path: Path, store: StoreSettings, transport: str) -> Path:
    path = tmp_path / "relayer.toml"
    path.write_text(
        f"""
[worker]
pool_size = 8

[stores.orders]
dsn = "{store.require_dsn()}"
table_prefix = "{store.table_prefix}"
lanes = {store.lanes}
lease_duration = "10s"
poll_interval = "0.2s"
default_transport = "broker"

[stores.orders.transports.broker]
{transport}
"""
    )
    return path


def write_rows(store: StoreSettings, destination: str) -> list[uuid.UUID]:
    rng = random.Random(11)
    ids: list[uuid.UUID] = []
    outbox = Outbox(store)
    with psycopg.connect(store.require_dsn()) as conn:
        for start in range(0, ROWS, 1_000):
            messages = [
                OutboxMessage(
                    destination, f"{start + index}".encode(), key=f"key-{rng.randrange(KEYS)}"
                )
                for index in range(1_000)
            ]
            ids.extend(outbox.write_many(conn, messages))
            conn.commit()
    return ids


@pytest.fixture
async def acceptance_store(pg_dsn: str) -> StoreSettings:
    store = make_store(pg_dsn, lanes=32)
    await apply_schema(store)
    return store


@contextlib.contextmanager
def workers(config: Path) -> Iterator[list[subprocess.Popen[str]]]:
    processes = [
        subprocess.Popen(
            command("--config", str(config), "run", "orders"),
            env=environment(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(WORKERS)
    ]
    try:
        yield processes
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def relay_everything(store: StoreSettings, config: Path, destination: str) -> list[uuid.UUID]:
    with workers(config) as processes:
        written = write_rows(store, destination)
        deadline = time.monotonic() + 180
        while pending(store) and time.monotonic() < deadline:
            for process in processes:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
            time.sleep(0.2)
        assert pending(store) == 0  # I4
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            _, stderr = process.communicate(timeout=30)
            assert process.returncode == 0, stderr
    return written


def check_invariants(written: Sequence[uuid.UUID], received: Sequence[Received]) -> None:
    ids = [uuid.UUID(message.message_id) for message in received]
    assert set(ids) >= set(written)  # I1
    last: dict[str | None, uuid.UUID] = {}
    seen: set[uuid.UUID] = set()
    for message_id, message in zip(ids, received, strict=True):
        if message_id in seen:
            continue
        seen.add(message_id)
        previous = last.get(message.key)
        assert previous is None or previous < message_id, f"key {message.key} out of order"  # I2
        last[message.key] = message_id
    assert len({message.key for message in received}) == KEYS


@pytest.mark.slow
def test_three_workers_relay_to_kafka(
    acceptance_store: StoreSettings, kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = unique("orders")
    create_topics(kafka_bootstrap, [topic], partitions=8)
    config = config_file(
        tmp_path, acceptance_store, f'type = "kafka"\n"bootstrap.servers" = "{kafka_bootstrap}"'
    )
    written = relay_everything(acceptance_store, config, topic)
    received = consume_kafka(kafka_bootstrap, topic, ROWS)
    check_invariants(written, received)


@pytest.mark.slow
async def test_three_workers_relay_to_rabbitmq(
    acceptance_store: StoreSettings, rabbitmq_url: str, tmp_path: Path
) -> None:
    import aio_pika

    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(unique("orders"), durable=True)
        config = config_file(
            tmp_path, acceptance_store, f'type = "rabbitmq"\nurl = "{rabbitmq_url}"'
        )
        written = await asyncio.to_thread(
            relay_everything, acceptance_store, config, "/" + queue.name
        )
        received = await consume_rabbitmq(connection, queue.name, ROWS)
        check_invariants(written, received)
        await queue.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()
