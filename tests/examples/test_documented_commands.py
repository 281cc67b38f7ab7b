"""The examples' READMEs, run as written from the project's environment, with Kafka and RabbitMQ.

The order service's steps (topics or queues, `relayer schema apply orders`, uvicorn, `relayer
run orders`, stocking a product and two orders over HTTP, `relayer status orders`) and then the
consumer's (`relayer schema apply billing`, the consumer script), each command taken from the
README (its addresses pointed at the test's servers, its destinations made unique). The order
is invoiced once, the refused order leaves nothing, and the consumer says so in its output.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.contract.brokers import unique
from tests.examples.documented import (
    ROOT,
    code_block,
    documented,
    environment,
    run,
    running,
    wait_until,
)

SERVICE = ROOT / "examples/fastapi_sqlalchemy"
SERVICE_README = SERVICE / "README.md"
CONSUMERS = ROOT / "examples/consumers"
CONSUMERS_README = CONSUMERS / "README.md"
UVICORN = (
    "uvicorn --factory --app-dir examples/fastapi_sqlalchemy orders_service:create_app --port 8000"
)
CURL = "curl -s -X {method} localhost:8000/{path} -H 'content-type: application/json'"


@dataclass(frozen=True)
class Broker:
    name: str
    config: str  # the order service's relayer settings
    address: str  # as the example files write it
    declare: tuple[Path, str]  # the README and a line of its block that creates the destinations
    consumer: str  # the consumer's documented command
    address_option: str  # how the consumer is pointed elsewhere
    destination_prefix: str  # ORDERS_EVENTS=/orders.events for RabbitMQ queues


KAFKA = Broker(
    "kafka",
    "relayer.toml",
    "127.0.0.1:9092",
    (SERVICE_README, "AdminClient("),
    "python examples/consumers/kafka_consumer.py --bootstrap 127.0.0.1:9092 --topic orders.events",
    "--bootstrap",
    "",
)
RABBITMQ = Broker(
    "rabbitmq",
    "relayer-rabbitmq.toml",
    "amqp://guest:guest@127.0.0.1:5672/",
    (CONSUMERS_README, "declare_queue("),
    "python examples/consumers/rabbitmq_consumer.py --queue orders.events",
    "--url",
    "/",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pointed(text: str, pg_dsn: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        text = text.replace(old, new)
    return re.sub(r'^dsn = ".*"$', f"dsn = {json.dumps(pg_dsn)}", text, flags=re.MULTILINE)


def heredoc(document: Path, containing: str) -> str:
    """The Python of a ``python - <<'EOF' ... EOF`` step in one of the document's sh blocks."""
    block = code_block(document, "sh", containing)
    match = re.search(r"^python - <<'EOF'\n(.*?)^EOF$", block, re.MULTILINE | re.DOTALL)
    assert match, f"{document.name}: no python heredoc around {containing!r}"
    return match.group(1)


def count(pg_dsn: str, query: str) -> int:
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


pytestmark = pytest.mark.slow  # about 20 s each: five processes, two consumer start-ups


@pytest.fixture(params=["kafka", "rabbitmq"])
def broker(request: pytest.FixtureRequest) -> tuple[Broker, str]:
    """The broker and the test's address for it."""
    if request.param == "kafka":
        return KAFKA, str(request.getfixturevalue("kafka_bootstrap"))
    return RABBITMQ, str(request.getfixturevalue("rabbitmq_url"))


def test_the_order_service_and_its_consumer_run_as_their_readmes_say(
    tmp_path: Path, pg_dsn: str, broker: tuple[Broker, str]
) -> None:
    kind, address = broker
    events, confirmations = unique("orders-events"), unique("orders-confirmations")
    replacements = {
        kind.address: address,
        "orders.events": events,
        "orders.confirmations": confirmations,
    }
    configs = {"orders.toml": SERVICE / kind.config, "billing.toml": CONSUMERS / "relayer.toml"}
    for name, source in configs.items():
        (tmp_path / name).write_text(pointed(source.read_text(), pg_dsn, replacements))
    port = free_port()
    service_env = environment(
        RELAYER_CONFIG=str(tmp_path / "orders.toml"),
        ORDERS_EVENTS=kind.destination_prefix + events,
        ORDERS_CONFIRMATIONS=kind.destination_prefix + confirmations,
    )
    consumer_env = environment(RELAYER_CONFIG=str(tmp_path / "billing.toml"))
    documented(SERVICE_README, f"export RELAYER_CONFIG=examples/fastapi_sqlalchemy/{kind.config}")
    documented(SERVICE_README, "make venv && . .venv/bin/activate", UVICORN, "relayer run orders &")
    documented(CONSUMERS_README, "export RELAYER_CONFIG=examples/consumers/relayer.toml")
    documented(CONSUMERS_README, "relayer schema apply billing", kind.consumer)
    if kind is RABBITMQ:
        documented(SERVICE_README, "export ORDERS_EVENTS=/orders.events ORDERS_CONFIRMATIONS=")

    declare = pointed(heredoc(*kind.declare), pg_dsn, replacements)
    for _ in range(2):  # run again, the step leaves existing topics and queues alone
        subprocess.run(
            ["python", "-"], input=declare, text=True, cwd=ROOT, env=service_env, check=True
        )
    run(["relayer", "schema", "apply", "orders"], cwd=ROOT, env=service_env)
    uvicorn = shlex.split(UVICORN.replace("8000", str(port)))
    output: list[str] = []
    with (
        # uvicorn shuts down gracefully, then re-raises the signal: its status is -SIGTERM.
        running(uvicorn, cwd=ROOT, env=service_env, output=output, exits=(0, -signal.SIGTERM)),
        running(["relayer", "run", "orders"], cwd=ROOT, env=service_env, output=output),
    ):
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: answers(f"{base}/openapi.json"), "uvicorn to serve the app")
        place_orders(base)
        status = run(["relayer", "status", "orders"], cwd=ROOT, env=service_env)
        assert "orders" in status.stdout

        run(["relayer", "schema", "apply", "billing"], cwd=ROOT, env=consumer_env)
        consumer = shlex.split(kind.consumer.replace("orders.events", events))
        consumer = [*consumer, kind.address_option, address]
        consumed: list[str] = []
        with running(consumer, cwd=ROOT, env=consumer_env, output=consumed):
            wait_until(
                lambda: invoices(pg_dsn) == 1, "the consumer to invoice the order", within=90
            )
    assert count(pg_dsn, "SELECT count(*) FROM orders") == 1
    assert count(pg_dsn, "SELECT count(*) FROM orders_outbox") == 0  # the worker sent both rows
    assert "customer customer-7: invoiced (message " in consumed[0]  # the consumer's own output


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def invoices(pg_dsn: str) -> int:
    with psycopg.connect(pg_dsn) as conn:
        exists = conn.execute("SELECT to_regclass('invoices') IS NOT NULL").fetchone()
    return count(pg_dsn, "SELECT count(*) FROM invoices") if exists and exists[0] else 0


def place_orders(base: str) -> None:
    """The README's curl commands, sent with httpx."""
    stock = {"stock": 10}
    order = {"customer_id": "customer-7", "product_id": "book", "quantity": 2}
    refused = {**order, "quantity": 20}
    documented(
        SERVICE_README,
        CURL.format(method="PUT", path="products/book") + f" -d '{json.dumps(stock)}'",
        CURL.format(method="POST", path="orders") + " \\\n  -d '" + json.dumps(order) + "'",
        CURL.format(method="POST", path="orders") + " \\\n  -d '" + json.dumps(refused) + "'",
        "relayer status orders",
    )
    assert httpx.put(f"{base}/products/book", json=stock).json() == stock
    assert httpx.post(f"{base}/orders", json=order).status_code == 201
    assert httpx.post(f"{base}/orders", json=refused).status_code == 409
