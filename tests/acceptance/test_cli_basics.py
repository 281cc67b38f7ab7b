"""The CLI's contract: exit statuses, one-line configuration errors, schema commands."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psycopg
import pytest

from relayer import __version__
from relayer.settings import StoreSettings
from tests.acceptance.cli import command, environment, relayer
from tests.conftest import make_store


def test_version_and_module_entry_point() -> None:
    result = relayer("--version", env=environment())
    assert result.returncode == 0
    assert result.stdout.strip() == f"relayer {__version__}"


def test_usage_errors_exit_2() -> None:
    assert relayer("schema", env=environment()).returncode == 2
    assert relayer("bogus", env=environment()).returncode == 2


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        ("LANES", "0", "stores.orders.lanes"),
        ("BATCH_SIZE", "10001", "stores.orders.batch_size"),
        ("LEASE_DURATION", "2h", "stores.orders.lease_duration"),
        ("POLL_INTERVAL", "20s", "stores.orders.poll_interval"),
        ("SCHEMA", 'x"; drop table y; --', "stores.orders.schema"),
        ("TABLE_PREFIX", "Orders_", "stores.orders.table_prefix"),
        ("TABLE_PREFIX", "p" * 64, "stores.orders.table_prefix"),
    ],
)
def test_configuration_errors_are_one_line_with_field_value_and_rule(
    variable: str, value: str, field: str
) -> None:
    env = environment(**{f"RELAYER_STORES__ORDERS__{variable}": value})
    result = relayer("schema", "print", "orders", env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert field in lines[0]
    assert repr(value) in lines[0] or value in lines[0]
    assert "is invalid:" in lines[0]


def test_unknown_store_names_the_configured_ones() -> None:
    env = environment(RELAYER_STORES__ORDERS__LANES="8")
    result = relayer("schema", "print", "billing", env=env)
    assert result.returncode == 2
    assert "'billing'" in result.stderr and "'orders'" in result.stderr


def test_missing_config_file_is_a_configuration_error(tmp_path: Path) -> None:
    result = relayer(
        "--config", str(tmp_path / "absent.toml"), "schema", "print", "x", env=environment()
    )
    assert result.returncode == 2
    assert "does not exist" in result.stderr


def test_passwords_never_reach_the_terminal() -> None:
    secret = "pa55-w0rd-s3cret"
    env = environment(
        RELAYER_STORES__ORDERS__DSN=f"postgresql://app:{secret}@127.0.0.1:1/shop?connect_timeout=2"
    )
    result = relayer("schema", "apply", "orders", env=env)
    assert result.returncode == 1
    assert "cannot connect" in result.stderr
    assert secret not in result.stderr + result.stdout


def test_hostile_identifier_touches_nothing(pg_dsn: str) -> None:
    store = make_store(pg_dsn)
    env = environment(store, RELAYER_STORES__ORDERS__SCHEMA='x"; drop table y; --')
    before = _relations(pg_dsn)
    result = relayer("schema", "apply", "orders", env=env)
    assert result.returncode == 2
    assert _relations(pg_dsn) == before


def _relations(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT nspname || '.' || relname FROM pg_class JOIN pg_namespace n "
            "ON n.oid = relnamespace WHERE nspname NOT LIKE 'pg_%' AND nspname <> "
            "'information_schema'"
        ).fetchall()
    return {row[0] for row in rows}


def test_schema_print_apply_check(pg_dsn: str) -> None:
    store = make_store(pg_dsn, schema="messaging")
    printed = relayer("schema", "print", "orders", store=store)
    assert printed.returncode == 0
    assert 'CREATE TABLE "messaging"."orders_outbox"' in printed.stdout
    assert relayer("schema", "check", "orders", store=store).returncode == 1  # not applied
    applied = relayer("schema", "apply", "orders", store=store)
    assert applied.returncode == 0, applied.stderr
    assert "applied 0001_initial" in applied.stdout
    again = relayer("schema", "apply", "orders", store=store)
    assert "up to date" in again.stdout
    checked = relayer("schema", "check", "orders", store=store)
    assert checked.returncode == 0, checked.stdout
    assert "matches schema version" in checked.stdout
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DROP INDEX messaging.orders_parked_lane")
    drifted = relayer("schema", "check", "orders", store=store)
    assert drifted.returncode == 1
    assert "index orders_parked_lane missing" in drifted.stdout


def test_two_processes_apply_at_once(pg_dsn: str) -> None:
    store: StoreSettings = make_store(pg_dsn, schema="together")
    env = environment(store)
    processes = [
        subprocess.Popen(
            command("schema", "apply", "orders"),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [process.communicate(timeout=60) for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs
    assert sum("applied 0001_initial" in out for out, _ in outputs) == 1
    assert relayer("schema", "check", "orders", store=store).returncode == 0


@pytest.mark.parametrize(
    "arguments", [("schema", "print", "orders"), ("status", "orders"), ("parked", "list", "orders")]
)
def test_a_reader_that_goes_away_ends_the_command_quietly(
    store: StoreSettings, arguments: tuple[str, ...]
) -> None:
    read, write = os.pipe()
    os.close(read)  # as `| head` does once it has its lines: every write fails with EPIPE
    try:
        result = subprocess.run(
            command(*arguments),
            env=environment(store),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert result.stderr == ""
    assert result.returncode == 141


def test_without_any_configuration_the_error_says_how_to_give_it() -> None:
    result = relayer("status", "orders", env=environment())
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "relayer: error: store: 'orders' is invalid: is not configured, and no store is: give a "
        "TOML file with --config FILE or RELAYER_CONFIG, holding a [stores.orders] section, or "
        "set RELAYER_STORES__ORDERS__DSN"
    ]


@pytest.mark.parametrize("action", ["redrive", "drop"])
def test_a_named_key_that_is_not_parked_is_a_failure(store: StoreSettings, action: str) -> None:
    result = relayer("parked", action, "orders", "--key", "no-such-key", env=environment(store))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"relayer: store 'orders': key 'no-such-key' is not parked, nothing to {action}; "
        "`relayer parked list orders` shows the parked keys"
    ]
    confirmed = ("--yes",) if action == "drop" else ()
    every = relayer("parked", action, "orders", *confirmed, env=environment(store))
    assert (every.returncode, every.stdout) == (0, f"store 'orders': no parked key to {action}\n")
