"""The schema commands through PgBouncer in transaction mode (apply is one transaction; check
builds its expected tables in a transaction it rolls back), and on ``admin_dsn`` when set."""

from __future__ import annotations

from tests.acceptance.cli import environment, relayer
from tests.conftest import make_store
from tests.pgbouncer import PgBouncer

PREFIX = "RELAYER_STORES__ORDERS__"


def test_apply_and_check_through_pgbouncer(pg_dsn: str, pgbouncer_strict: PgBouncer) -> None:
    store = make_store(pgbouncer_strict.dsn_for(pg_dsn), pooler="transaction")
    env = environment(store, **{PREFIX + "POOLER": "transaction"})
    applied = relayer("schema", "apply", "orders", env=env)
    assert applied.returncode == 0, applied.stderr
    assert "applied 0001_initial" in applied.stdout
    checked = relayer("schema", "check", "orders", env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "matches schema version" in checked.stdout


def test_the_schema_commands_use_admin_dsn(pg_dsn: str) -> None:
    unreachable = make_store("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2")
    env = environment(unreachable, **{PREFIX + "ADMIN_DSN": pg_dsn})
    applied = relayer("schema", "apply", "orders", env=env)
    assert applied.returncode == 0, applied.stderr
    checked = relayer("schema", "check", "orders", env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    status = relayer("status", "orders", env=env)  # everything else connects to dsn
    assert status.returncode == 1 and "127.0.0.1:1" in status.stderr
