"""A parked key's error text is shown redacted by every command, as in the worker's log and on
the dashboard: a broker URL's password in it never reaches a terminal."""

from __future__ import annotations

import json
from pathlib import Path

from relayer.settings import StoreSettings
from tests.acceptance.cli import environment
from tests.badinput.support import SECRET, CliCase, run_cases
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import park

ERROR = f"cannot publish to amqp://guest:{SECRET}@broker.internal/x: access refused"
SHOWN = "amqp://guest:***@broker.internal/x"
COMMANDS = {
    "parked-list": ("parked", "list", "orders"),
    "parked-list-json": ("parked", "list", "orders", "--json"),
    "parked-list-key": ("parked", "list", "orders", "--key", "k1"),
    "status": ("status", "orders"),
    "status-json": ("status", "orders", "--json"),
}


async def test_every_command_shows_a_parked_error_redacted(pg_dsn: str, tmp_path: Path) -> None:
    store: StoreSettings = make_store(pg_dsn)
    await apply_schema(store)
    park(store, "k1", error=ERROR)
    cases = [CliCase(name, arguments) for name, arguments in COMMANDS.items()]
    results = run_cases(cases, tmp_path, environment(store))
    for name, result in results.items():
        assert result.returncode == 0, (name, result.stderr)
        assert SECRET not in result.stdout + result.stderr, name
        assert SHOWN in result.stdout, (name, result.stdout)
    [key] = json.loads(results["parked-list-json"].stdout)["parked"]
    assert key["last_error"] == f"cannot publish to {SHOWN}: access refused"
