"""``relayer status --all``: one line per configured store, worst first, as an operator of many
stores reads it (and as a health check: ``--check``)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg

from relayer.settings import StoreSettings
from tests.acceptance.cli import environment, relayer
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import park, write


def fleet_environment(*stores: StoreSettings) -> dict[str, str]:
    env = environment()
    for store in stores:
        prefix = f"RELAYER_STORES__{store.name.upper()}__"
        env[prefix + "DSN"] = store.require_dsn()
        env[prefix + "TABLE_PREFIX"] = store.table_prefix
        env[prefix + "LANES"] = str(store.lanes)
    return env


async def test_status_all_lists_every_store_worst_first(pg_dsn: str) -> None:
    parked = make_store(pg_dsn, name="billing", table_prefix="billing_")
    backlog = make_store(pg_dsn, name="orders", table_prefix="orders_")
    idle = make_store(pg_dsn, name="audit", table_prefix="audit_")
    missing = make_store(pg_dsn, name="ledger", table_prefix="ledger_")  # schema never applied
    gone = make_store(
        "postgresql://relayer:s3cret@127.0.0.1:1/nowhere", name="gone", table_prefix="gone_"
    )
    for store in (parked, backlog, idle):
        await apply_schema(store)
    park(parked, "stuck", error="refused by the broker")
    write(backlog, ["a", "b", "c"], per_key=4)
    env = fleet_environment(parked, backlog, idle, missing, gone)

    result = relayer("status", "--all", env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["store", "pending", "oldest", "s", "parked", "operator", "members"]
    names = [line.split()[0] for line in lines[1:]]
    # Unreadable stores first (by name), then the parked key, then the longest backlog.
    assert names == ["gone", "ledger", "billing", "orders", "audit"]
    assert "cannot be read" in lines[1] and "s3cret" not in result.stdout
    assert "schema apply ledger" in lines[2]
    assert lines[3].split()[1:] == ["2", lines[3].split()[2], "1", "1", "0"]
    assert lines[4].split()[1] == "12"

    document = json.loads(relayer("status", "--all", "--json", env=env).stdout)
    by_name = {entry["store"]: entry for entry in document["stores"]}
    assert [entry["store"] for entry in document["stores"]] == names
    assert by_name["orders"]["pending"] == 12 and by_name["orders"]["error"] is None
    assert by_name["billing"]["waiting_for_operator"] == 1
    assert by_name["gone"]["error"] and "s3cret" not in json.dumps(document)

    checked = relayer("status", "--all", "--check", env=env)
    assert checked.returncode == 1
    failures = [line for line in checked.stdout.splitlines() if line.startswith("check failed")]
    assert len(failures) == 3  # gone, ledger unreadable; billing parked

    healthy = fleet_environment(backlog, idle)
    assert relayer("status", "--all", "--check", env=healthy).returncode == 0
    lagging = relayer("status", "--all", "--max-lag", "0.001", env=healthy)
    assert lagging.returncode == 1 and "'orders'" in lagging.stdout


def test_status_needs_a_store_or_all(store: StoreSettings) -> None:
    neither = relayer("status", store=store)
    assert neither.returncode == 2
    assert "--all" in neither.stderr and "Traceback" not in neither.stderr
    both = relayer("status", "orders", "--all", store=store)
    assert both.returncode == 2 and "not both" in both.stderr


async def test_status_all_includes_the_stores_a_template_lists(pg_dsn: str, tmp_path: Path) -> None:
    for schema_name in ("acme", "globex"):
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema_name}")
        await apply_schema(make_store(pg_dsn, db_schema=schema_name, table_prefix="outbox_"))
    write(make_store(pg_dsn, db_schema="globex", table_prefix="outbox_"), ["a"], per_key=3)
    listing = tmp_path / "tenants.toml"
    listing.write_text(
        '[[stores]]\nname = "acme"\nschema = "acme"\n\n'
        '[[stores]]\nname = "globex"\nschema = "globex"\n\n'
        '[[stores]]\nname = "bad"\nschema = "x"\nweight = 0\n'
    )
    config = tmp_path / "relayer.toml"
    config.write_text(
        f'[templates.tenants]\ndsn = "{pg_dsn}"\nlanes = 16\ntable_prefix = "outbox_"\n\n'
        f'[templates.tenants.discovery]\nfile = "{listing}"\n'
    )
    result = relayer("--config", str(config), "status", "--all", env=environment())
    assert result.returncode == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert names == ["tenants.?", "tenants.globex", "tenants.acme"]
    assert "weight" in result.stdout.splitlines()[1]
