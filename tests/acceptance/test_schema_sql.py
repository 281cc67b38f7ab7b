"""`relayer schema sql`: the migrations of schema/ as plain DDL for a migration tool of one's own.

A database brought to every older version by the printed script, then upgraded one version at
a time by the printed scripts (each run in a transaction of the "tool", as Flyway would), is
what `relayer schema apply` makes: `schema check` reports no drift and `apply` finds nothing
to do. Also the layout of schema/ and the command's refusals.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from relayer.cli import main
from relayer.sql import migrations
from tests.examples.documented import ROOT

SCHEMA_FLAGS = ("--table-prefix", "shop_", "--lanes", "8")


@pytest.fixture(autouse=True)
def _no_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No configuration file (RELAYER_CONFIG set but empty), unless --config names one."""
    monkeypatch.setenv("RELAYER_CONFIG", "")
    monkeypatch.chdir(tmp_path)


def printed(capsys: pytest.CaptureFixture[str], *arguments: str) -> str:
    capsys.readouterr()
    status = main(list(arguments))
    output = capsys.readouterr()
    assert status == 0, output.err
    return output.out


def test_schema_holds_one_file_per_version_the_package_applies() -> None:
    files = sorted(path.name for path in (ROOT / "schema").glob("*.sql"))
    assert files == [f"{migration.label}.sql" for migration in migrations()]
    for migration in migrations():
        assert (ROOT / "schema" / f"{migration.label}.sql").read_text() == migration.template


def test_every_old_version_upgraded_through_the_printed_files_has_no_drift(
    pg_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    latest = len(migrations())
    config = tmp_path / "relayer.toml"
    for old in range(latest):
        schema = f"upgraded_from_{old}"
        flags = ("--schema", schema, *SCHEMA_FLAGS)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            if old:
                conn.execute(printed(capsys, "schema", "sql", *flags, "--to", str(old)))
            for version in range(old, latest):
                step = printed(
                    capsys, "schema", "sql", *flags, "--from", str(version),
                    "--to", str(version + 1), "--no-transaction",
                )  # fmt: skip
                assert not step.startswith("BEGIN;") and not step.endswith("COMMIT;\n")
                with conn.transaction():
                    conn.execute(step)
        config.write_text(
            f"[stores.orders]\ndsn = {json.dumps(pg_dsn)}\nschema = {json.dumps(schema)}\n"
            'table_prefix = "shop_"\nlanes = 8\n'
        )
        checked = printed(capsys, "--config", str(config), "schema", "check", "orders")
        assert f"matches schema version {latest} (lanes 8)" in checked, (old, checked)
        applied = printed(capsys, "--config", str(config), "schema", "apply", "orders")
        assert "up to date" in applied, (old, applied)


def test_a_configured_store_is_printed_with_its_own_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "relayer.toml"
    config.write_text('[stores.orders]\nschema = "messaging"\ntable_prefix = "orders_"\n')
    whole = printed(capsys, "--config", str(config), "schema", "sql", "orders")
    assert whole == printed(capsys, "--config", str(config), "schema", "print", "orders")
    assert 'CREATE TABLE "messaging"."orders_outbox"' in whole
    other = printed(capsys, "--config", str(config), "schema", "print", "orders", "--schema", "b")
    assert 'CREATE TABLE "b"."orders_outbox"' in other


def test_print_and_sql_need_no_configured_store(capsys: pytest.CaptureFixture[str]) -> None:
    whole = printed(capsys, "schema", "print")
    assert 'CREATE TABLE "public"."relayer_outbox"' in whole
    step = printed(capsys, "schema", "sql", "--schema", "acme", "--from", "6", "--to", "7")
    assert step.startswith("BEGIN;\n") and step.endswith("COMMIT;\n")
    assert 'ON "acme"."relayer_leases"' in step
    assert 'UPDATE "acme"."relayer_meta" SET schema_version = 7' in step
    assert "CREATE TABLE" not in step


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("--from", "3", "--to", "3"), "--from: 3 is invalid: it must be below --to (3)"),
        (("--table-prefix", "Shop"), "--table-prefix: 'Shop' is invalid: must be a plain"),
        (("--lanes", "0"), "--lanes: '0' is invalid: must be an integer from 1 to 65,536"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(
    arguments: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schema", "sql", *arguments]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"relayer: error: {message}"), error
    assert len(error.strip().splitlines()) == 1
