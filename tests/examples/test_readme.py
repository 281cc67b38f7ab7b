"""The README's and the quickstart's "Use it in an application", run as written against real
services.

Each document's relayer.toml (addresses pointed at the test's PostgreSQL and Kafka), read from
the current directory; `relayer schema apply orders`; the topic created with the document's
AdminClient snippet, twice (a topic that exists already is fine); its writer snippet run as a
script; `relayer run orders` until the row is gone; and the event read back from Kafka.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

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
    "pip install '.[kafka,embedded]'",
    "relayer dev --database shop",
)


def relay_as_written(
    document: Path,
    directory: Path,
    pg_dsn: str,
    pointed: Callable[[str], str],
    config: str | None = None,
) -> None:
    """The document's steps from its relayer.toml (or ``config``) to a worker that sent what
    its snippet wrote."""
    for name, language, containing in (
        ("relayer.toml", "toml", 'default_transport = "kafka"'),
        ("create_topic.py", "python", "AdminClient"),
        ("write.py", "python", "outbox.write("),
    ):
        (directory / name).write_text(pointed(code_block(document, language, containing)))
    if config is not None:
        (directory / "relayer.toml").write_text(config)
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
    replacements = {"127.0.0.1:9092": kafka_bootstrap, "account-events": topic}
    relay_as_written(QUICKSTART, tmp_path, pg_dsn, pointer(pg_dsn, replacements))

    received = read_one(kafka_bootstrap, topic)
    assert json.loads(received.body) == {"type": "Debited", "amount": 10}
    assert received.key == "account-7"
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT id, balance FROM accounts").fetchall() == [(7, 90)]


def test_the_readme_reaches_kafka_on_relayer_dev(tmp_path: Path) -> None:
    """Without servers of one's own: `relayer dev` as a subprocess (on free ports: this machine
    may serve 5432 and 9092 itself) and the relayer.toml it prints; the README's topic and
    writer snippets and `relayer run orders` send the row to its Kafka; SIGINT (Ctrl-C) stops
    both servers and leaves no process behind."""
    log = tmp_path / "dev.log"
    command = [sys.executable, "-m", "relayer", "dev", "--pg-port", "0", "--kafka-port", "0"]
    with log.open("w") as output:
        dev = subprocess.Popen(
            [*command, "--database", "shop"],
            cwd=tmp_path,
            env=environment(),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(lambda: "ready:" in log.read_text() or dev.poll() is not None, "relayer dev")
            assert dev.poll() is None, log.read_text()
            config = log.read_text().split("on them:\n\n")[1].split("\nready:")[0]
            orders = tomllib.loads(config)["stores"]["orders"]
            dsn, bootstrap = orders["dsn"], orders["transports"]["kafka"]["bootstrap.servers"]
            assert conninfo_to_dict(dsn)["dbname"] == "shop"
            application = tmp_path / "application"
            application.mkdir()
            pointed = pointer(dsn, {"127.0.0.1:9092": bootstrap})
            relay_as_written(README, application, dsn, pointed, config=config)
            received = read_one(bootstrap, "orders.events")
            assert json.loads(received.body) == {"type": "OrderPlaced", "id": 1}
        finally:
            if dev.poll() is None:
                dev.send_signal(signal.SIGINT)
            status = dev.wait(120)
    printed = log.read_text()
    assert status == 0, printed
    assert printed.rstrip().endswith("relayer dev: stopped"), printed
    pg_port, kafka_port = int(conninfo_to_dict(dsn)["port"]), int(bootstrap.rpartition(":")[2])
    assert not listening(pg_port) and not listening(kafka_port)
    assert processes_naming(f"-p {pg_port} ", f"tcp://127.0.0.1:{kafka_port} ") == []


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
        return True
    return False


def processes_naming(*texts: str) -> list[str]:
    """The command lines of running processes that contain any of ``texts``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            line = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if any(text in line for text in texts):
                found.append(line)
    return found
