"""Rows of a template's discovery source that a worker skips, through the command line.

A row the worker skips (no name, a name listed twice, tables another row or a configured
store uses) gets a ``TEMPLATE.?`` line in ``status --all`` (the dashboard's Fleet page reads
the same listing), and the other rows' stores are listed and usable by name. Stores on one
database are read on one connection: each reports its own name when it cannot be reached.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.badinput.support import SECRETS, UNREACHABLE_DSN, CliCase, run_cases

TOML = """\
[stores.orders]
table_prefix = "orders_"
[stores.billing]
table_prefix = "billing_"
[templates.tenants]
discovery.file = "{rows}"
"""
ROWS = [
    {"schema": "acme"},
    {"name": "good", "schema": "good"},
    {"name": "good", "schema": "other"},
    {"name": "twin", "schema": "good"},
    {"name": "clash", "schema": "public", "table_prefix": "orders_"},
]


@pytest.fixture(scope="module")
def results(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, subprocess.CompletedProcess[str]]:
    directory: Path = tmp_path_factory.mktemp("discovery-rows")
    rows = directory / "rows.json"
    rows.write_text(json.dumps(ROWS))
    toml = TOML.format(rows=rows)
    cases = [
        CliCase("status-all", ("status", "--all"), toml=toml),
        CliCase("status-all-json", ("status", "--all", "--json"), toml=toml),
        CliCase("print-good", ("schema", "print", "tenants.good"), toml=toml),
    ]
    return run_cases(cases, directory, {"RELAYER_DSN": UNREACHABLE_DSN})


def checked(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    for secret in SECRETS:
        assert secret not in result.stdout + result.stderr
    return result.stdout


def test_status_all_lists_each_row_the_worker_skips(
    results: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    lines = checked(results["status-all"]).splitlines()
    skipped = sorted(
        line.split("a row is skipped: ", 1)[1] for line in lines if "tenants.?" in line
    )
    assert skipped == [
        "row 1.name: None is invalid: is required: the store's name (the store is called "
        "TEMPLATE.NAME); give the row a name",
        "stores.tenants.clash: 'public.orders_*' is invalid: uses the same database, schema and "
        "table prefix as store 'orders'; distinct stores must not share tables",
        "stores.tenants.good: 'good' is invalid: is listed twice (row 3 and before); list each "
        "store once",
        "stores.tenants.twin: 'good.relayer_*' is invalid: uses the same database, schema and "
        "table prefix as store 'tenants.good'; distinct stores must not share tables",
    ]
    stores = sorted(line.split()[0] for line in lines[1:] if "tenants.?" not in line)
    assert stores == ["billing", "orders", "tenants.good"]


def test_stores_on_one_connection_each_report_their_own_name(
    results: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    document = json.loads(checked(results["status-all-json"]))
    errors = {
        entry["store"]: entry["error"]
        for entry in document["stores"]
        if entry["store"] in ("orders", "billing", "tenants.good")
    }
    assert sorted(errors) == ["billing", "orders", "tenants.good"]
    for store, error in errors.items():
        assert error.startswith(f"store {store!r}: cannot connect"), error
    lines = checked(results["status-all"]).splitlines()
    billing = next(line for line in lines if line.startswith("billing "))
    assert "'orders'" not in billing and "cannot be read: cannot connect" in billing


def test_a_store_listed_beside_a_bad_row_is_usable_by_name(
    results: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    assert 'CREATE SCHEMA IF NOT EXISTS "good"' in checked(results["print-good"])
