"""A failing start-up logs what went wrong, in text or JSON, and never a secret."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from relayer.embedded import free_port
from relayer.settings import StoreSettings
from tests.acceptance.cli import environment, relayer
from tests.conftest import apply_schema, make_store

DSN_PASSWORD = "pg-secret-8c1f"
SASL_PASSWORD = "sasl-secret-52d0"


def with_password(dsn: str, port: int | None = None) -> str:
    """``dsn`` with a password (the test server trusts loopback, so it is ignored there)."""
    parts = urlsplit(dsn)
    host = f"{parts.hostname}:{port or parts.port or 5432}"
    return urlunsplit(parts._replace(netloc=f"{parts.username}:{DSN_PASSWORD}@{host}"))


def config_file(directory: Path, dsn: str) -> Path:
    path = directory / "relayer.toml"
    path.write_text(
        f"""
[stores.orders]
dsn = "{dsn}"
table_prefix = "orders_"
default_transport = "kafka"

[stores.orders.transports.kafka]
type = "kafka"
"bootstrap.servers" = "127.0.0.1:{free_port()}"
"security.protocol" = "SASL_PLAINTEXT"
"sasl.mechanism" = "PLAIN"
"sasl.username" = "relayer"
"sasl.password" = "{SASL_PASSWORD}"
metadata_timeout = 1
""",
        "utf-8",
    )
    return path


def check_no_secret(output: str) -> None:
    assert DSN_PASSWORD not in output
    assert SASL_PASSWORD not in output


def json_records(stderr: str) -> list[dict[str, object]]:
    """Every log line as JSON; the CLI's own final error line is plain text."""
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith("relayer: ")
    return [json.loads(line) for line in lines[:-1]]


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    settings = make_store(pg_dsn, lanes=16)
    await apply_schema(settings)
    return settings


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_an_unreachable_broker_fails_start_up_without_secrets(
    store: StoreSettings, tmp_path: Path, log_format: str
) -> None:
    config = config_file(tmp_path, with_password(store.require_dsn()))
    result = relayer(
        "--config",
        str(config),
        "--log-level",
        "DEBUG",
        "--log-format",
        log_format,
        "run",
        "orders",
        env=environment(),
    )
    assert result.returncode == 1, result.stderr
    assert "cannot reach the cluster" in result.stderr
    check_no_secret(result.stdout + result.stderr)
    if log_format == "json":
        actions = {record.get("action") for record in json_records(result.stderr)}
        assert {"transport", "transport_error", "stop"} <= actions


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_an_unreachable_database_fails_start_up_without_secrets(
    pg_dsn: str, tmp_path: Path, log_format: str
) -> None:
    config = config_file(tmp_path, with_password(pg_dsn, port=free_port()))
    arguments = ("--log-level", "DEBUG", "--log-format", log_format, "run", "orders")
    result = relayer("--config", str(config), *arguments, env=environment())
    assert result.returncode == 1, result.stderr
    assert "cannot connect to postgresql://postgres:***@127.0.0.1:" in result.stderr
    check_no_secret(result.stdout + result.stderr)
    if log_format == "json":
        json_records(result.stderr)


def test_a_failed_start_up_prints_the_error_alone_at_the_default_level(
    pg_dsn: str, tmp_path: Path
) -> None:
    """No INFO "worker ... stopped" before the error: the worker never served."""
    config = config_file(tmp_path, with_password(pg_dsn, port=free_port()))
    result = relayer("--config", str(config), "run", "orders", env=environment())
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("relayer: store 'orders': cannot connect to"), lines
