"""The README's and the quickstart's "Use it in an application", run as written against real
services.

Each document's relayer.toml (addresses pointed at the test's PostgreSQL and Kafka), read from
the current directory; `relayer schema apply orders`; the topic created with the document's
AdminClient snippet, twice (a topic that exists already is fine); its writer snippet run as a
script; `relayer run orders` until the row is gone; and the event read back from Kafka.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg

from tests.contract.brokers import Received, consume_kafka, unique
from tests.examples.documented import (
    ROOT,
    code_block,
    documented,
    environment,
    run,
    running,
    wait_until,
)

README = ROOT / "README.md"
QUICKSTART = ROOT / "docs" / "quickstart.md"
INSTALL = (
    "git clone https://github.com/relayer-outbox/relayer.git && cd relayer",
    "pip install '.[kafka]'",
)


def relay_as_written(
    document: Path, directory: Path, pg_dsn: str, pointed: Callable[[str], str]
) -> None:
    """The document's steps from its relayer.toml to a worker that sent what its snippet wrote."""
    for name, language, containing in (
        ("relayer.toml", "toml", 'default_transport = "kafka"'),
        ("create_topic.py", "python", "AdminClient"),
        ("write.py", "python", "outbox.write("),
    ):
        (directory / name).write_text(pointed(code_block(document, language, containing)))
    documented(document, *INSTALL)
    documented(document, "`relayer schema apply orders`", "`relayer run orders`")
    env = environment()  # no RELAYER_CONFIG: ./relayer.toml is the file

    run([sys.executable, "-m", "relayer", "schema", "apply", "orders"], cwd=directory, env=env)
    for _ in range(2):  # run again, the snippet leaves the existing topic alone
        run([sys.executable, "create_topic.py"], cwd=directory, env=env)
    run([sys.executable, "write.py"], cwd=directory, env=env)

    def pending() -> int:
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute("SELECT count(*) FROM messaging.orders_outbox").fetchone()
        assert row is not None
        return int(row[0])

    assert pending() == 1
    output: list[str] = []
    command = [sys.executable, "-m", "relayer", "run", "orders"]
    with running(command, cwd=directory, env=env, output=output):
        wait_until(lambda: pending() == 0, f"the worker to send the {document.name} row")


def pointer(pg_dsn: str, replacements: dict[str, str]) -> Callable[[str], str]:
    def pointed(text: str) -> str:
        for old, new in replacements.items():
            text = text.replace(old, new)
        return re.sub(r'^dsn = ".*"$', f"dsn = {json.dumps(pg_dsn)}", text, flags=re.MULTILINE)

    return pointed


def read_one(kafka_bootstrap: str, topic: str) -> Received:
    [received] = consume_kafka(kafka_bootstrap, topic, 1)
    return received


def test_the_readme_example_runs_as_written(
    tmp_path: Path, pg_dsn: str, kafka_bootstrap: str
) -> None:
    topic = unique("orders-events")  # the broker outlives this test
    replacements = {"127.0.0.1:9092": kafka_bootstrap, "orders.events": topic}
    relay_as_written(README, tmp_path, pg_dsn, pointer(pg_dsn, replacements))

    received = read_one(kafka_bootstrap, topic)
    assert json.loads(received.body) == {"type": "OrderPlaced", "id": 1}
    assert received.key == "customer-7"
    assert received.headers["event-type"] == "OrderPlaced"
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT id, customer FROM orders").fetchall() == [(1, "customer-7")]


def test_the_quickstart_runs_as_written(tmp_path: Path, pg_dsn: str, kafka_bootstrap: str) -> None:
    """The quickstart creates the `accounts` table its writer updates (it used to update a
    table nobody created)."""
    topic = unique("account-events")
    replacements = {"kafka-1.internal:9092": kafka_bootstrap, "account-events": topic}
    relay_as_written(QUICKSTART, tmp_path, pg_dsn, pointer(pg_dsn, replacements))

    received = read_one(kafka_bootstrap, topic)
    assert json.loads(received.body) == {"type": "Debited", "amount": 10}
    assert received.key == "account-7"
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT id, balance FROM accounts").fetchall() == [(7, 90)]
