"""The README's "Use it in an application" section, run as written against real services.

Its relayer.toml (addresses pointed at the test's PostgreSQL and Kafka), read from the current
directory; `relayer schema apply orders`; the topic created with its AdminClient snippet; its
writer snippet run as a script; `relayer run orders` until the row is gone; and the event read
back from Kafka.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import psycopg

from tests.contract.brokers import consume_kafka, unique
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


def test_the_readme_example_runs_as_written(
    tmp_path: Path, pg_dsn: str, kafka_bootstrap: str
) -> None:
    topic = unique("orders-events")  # the broker outlives this test

    def pointed(text: str) -> str:
        text = text.replace("127.0.0.1:9092", kafka_bootstrap).replace("orders.events", topic)
        return re.sub(r'^dsn = ".*"$', f"dsn = {json.dumps(pg_dsn)}", text, flags=re.MULTILINE)

    config = code_block(README, "toml", 'default_transport = "kafka"')
    (tmp_path / "relayer.toml").write_text(pointed(config))
    (tmp_path / "create_topic.py").write_text(pointed(code_block(README, "python", "AdminClient")))
    (tmp_path / "write.py").write_text(pointed(code_block(README, "python", "outbox.write(")))
    documented(README, "pip install 'relayer-outbox[kafka]'")
    documented(README, "`relayer schema apply orders`", "`relayer run orders`")
    env = environment()  # no RELAYER_CONFIG: ./relayer.toml is the file

    run([sys.executable, "-m", "relayer", "schema", "apply", "orders"], cwd=tmp_path, env=env)
    run([sys.executable, "create_topic.py"], cwd=tmp_path, env=env)
    run([sys.executable, "write.py"], cwd=tmp_path, env=env)

    def pending() -> int:
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute("SELECT count(*) FROM messaging.orders_outbox").fetchone()
        assert row is not None
        return int(row[0])

    assert pending() == 1
    output: list[str] = []
    command = [sys.executable, "-m", "relayer", "run", "orders"]
    with running(command, cwd=tmp_path, env=env, output=output):
        wait_until(lambda: pending() == 0, "the worker to send the README's row")

    [received] = consume_kafka(kafka_bootstrap, topic, 1)
    assert json.loads(received.body) == {"type": "OrderPlaced", "id": 1}
    assert received.key == "customer-7"
    assert received.headers["event-type"] == "OrderPlaced"
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT id, customer FROM orders").fetchall() == [(1, "customer-7")]
