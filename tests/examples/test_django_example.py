"""examples/django_orders run as its README says, against real PostgreSQL.

An order placed through the management command commits with its event, which relayer then
relays; a refused order leaves neither. Run in subprocesses: Django's settings are per process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict

from relayer import load_settings
from relayer.testing import RecordingTransport, drain, run_sync
from tests.examples.documented import ROOT, documented, environment

EXAMPLE = ROOT / "examples" / "django_orders"
COMMANDS = (
    "export RELAYER_CONFIG=examples/django_orders/relayer.toml",
    "relayer schema apply orders",
    "python examples/django_orders/manage.py migrate",
    "python examples/django_orders/manage.py place_order customer-7 30",
    "python examples/django_orders/manage.py place_order customer-7 0",
)


def run(config: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=ROOT,
        env=environment(RELAYER_CONFIG=str(config)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_order_and_its_event_commit_together_and_a_refused_one_leaves_neither(
    pg_dsn: str, tmp_path: Path
) -> None:
    documented(EXAMPLE / "README.md", *COMMANDS)
    config = tmp_path / "relayer.toml"
    config.write_text(
        re.sub(
            r'^dsn = ".*"$',
            f"dsn = {json.dumps(pg_dsn)}",
            (EXAMPLE / "relayer.toml").read_text(),
            flags=re.MULTILINE,
        )
    )
    for arguments in (
        ("-m", "relayer", "schema", "apply", "orders"),
        ("examples/django_orders/manage.py", "migrate"),
    ):
        done = run(config, *arguments)
        assert done.returncode == 0, done.stderr
    placed = run(config, "examples/django_orders/manage.py", "place_order", "customer-7", "30")
    assert placed.returncode == 0, placed.stderr
    assert placed.stdout.strip() == "order 1 placed for customer-7"
    refused = run(config, "examples/django_orders/manage.py", "place_order", "customer-7", "0")
    assert refused.returncode == 1
    assert "amount must be positive, not 0; nothing was written" in refused.stderr
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT id, customer FROM orders_order").fetchall() == [
            (1, "customer-7")
        ]

    store = load_settings(config).store("orders")
    kafka = RecordingTransport("kafka")
    run_sync(kafka.start())
    assert drain(store, kafka).sent == 1
    [event] = kafka.assert_sent("orders.events", key="customer-7", count=1)
    assert json.loads(event.body) == {
        "type": "OrderPlaced", "id": 1, "customer": "customer-7", "amount": 30,
    }  # fmt: skip


@pytest.mark.parametrize(
    "config",
    ["django_orders/relayer.toml", "fastapi_sqlalchemy/relayer.toml", "consumers/relayer.toml"],
)
def test_the_examples_reach_the_database_of_the_compose_file_their_readmes_name(
    config: str,
) -> None:
    """Run as written with `docker compose -f docker/compose.yaml up`, each example uses the
    database the compose file creates, with its user and password (Django's tables once went
    to the `postgres` database, and its connection had no password)."""
    compose = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    postgres = compose["services"]["postgres"]
    environment_ = postgres["environment"]
    [port] = [mapping.split(":")[-2] for mapping in postgres["ports"]]  # host:port:port
    for dsn in re.findall(r'^dsn = "(.*)"$', (ROOT / "examples" / config).read_text(), re.M):
        assert conninfo_to_dict(dsn) == {
            "host": "127.0.0.1",
            "port": port,
            "user": environment_["POSTGRES_USER"],
            "password": environment_["POSTGRES_PASSWORD"],
            "dbname": environment_["POSTGRES_DB"],
        }
