"""``relayer run --template``: a worker process follows its template's discovery source, and
the commands that take a STORE take a discovered store's TEMPLATE.NAME."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import psycopg

from relayer.settings import StoreSettings, store_settings
from tests.acceptance.cli import command, environment, relayer
from tests.acceptance.test_run_cli import wait_until
from tests.examples.documented import ROOT, documented
from tests.integration.relay.helpers import write


def configured(pg_dsn: str, tmp_path: Path) -> tuple[dict[str, str], Path]:
    source = tmp_path / "stores.json"
    config = tmp_path / "relayer.toml"
    config.write_text(
        f"dsn = {json.dumps(pg_dsn)}\n"
        "[worker]\npool_size = 4\n"
        "[templates.tenants]\n"
        'lanes = 4\nlease_duration = "3s"\npoll_interval = "0.1s"\n'
        'default_transport = "memory"\ndiscover_interval = "1s"\n'
        '[templates.tenants.transports.memory]\ntype = "memory"\n'
        f"[templates.tenants.discovery]\nfile = {json.dumps(str(source))}\n"
    )
    return environment(RELAYER_CONFIG=str(config)), source


def tenant(pg_dsn: str, name: str) -> StoreSettings:
    return store_settings(name=f"tenants.{name}", dsn=pg_dsn, schema=name, lanes=4)


def pending(store: StoreSettings) -> int:
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(f"SELECT count(*) FROM {store.db_schema}.relayer_outbox").fetchone()
    assert row is not None
    return int(row[0])


def members(store: StoreSettings) -> int:
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {store.db_schema}.relayer_leases WHERE lane IS NULL"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_run_template_follows_its_source_without_a_restart(pg_dsn: str, tmp_path: Path) -> None:
    documented(ROOT / "docs/fleet.md", "relayer run --template tenants", "relayer schema apply")
    env, source = configured(pg_dsn, tmp_path)
    acme, globex = tenant(pg_dsn, "acme"), tenant(pg_dsn, "globex")
    source.write_text(json.dumps([{"name": "acme", "schema": "acme"}]))
    applied = relayer("schema", "apply", "tenants.acme", env=env)
    assert applied.returncode == 0, applied.stderr
    unlisted = relayer("schema", "apply", "tenants.globex", env=env)
    assert unlisted.returncode == 2
    assert "is not listed by the source of template tenants (file " in unlisted.stderr
    write(acme, ["k1", "k2"], per_key=3)
    process = subprocess.Popen(
        command("run", "--template", "tenants"), env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(lambda: pending(acme) == 0, 30)
        source.write_text(
            json.dumps([{"name": "acme", "schema": "acme"}, {"name": "globex", "schema": "globex"}])
        )
        assert relayer("schema", "apply", "tenants.globex", env=env).returncode == 0
        write(globex, ["k3"], per_key=3)
        wait_until(lambda: pending(globex) == 0, 30)
        source.write_text(json.dumps([{"name": "globex", "schema": "globex"}]))
        wait_until(lambda: members(acme) == 0, 30)  # it left while the process runs on
        status = relayer("status", "tenants.globex", env=env)
        assert status.returncode == 0, status.stderr
        assert "members (1):" in status.stdout
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "serving store tenants.globex too [action=store_join" in stderr
    assert "no longer serves store tenants.acme [action=store_leave" in stderr
    assert members(globex) == 0


def test_run_needs_stores_or_a_configured_template(pg_dsn: str, tmp_path: Path) -> None:
    env, _ = configured(pg_dsn, tmp_path)
    nothing = relayer("run", env=env)
    assert nothing.returncode == 2
    assert "which stores? give STORE names, or --template NAME" in nothing.stderr
    unknown = relayer("run", "--template", "partners", env=env)
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "relayer: error: template: 'partners' is invalid: is not configured (configured "
        "templates: 'tenants'); add a [templates.partners] section with its "
        "[templates.partners.discovery] source to the config file (docs/fleet.md)"
    )
