"""``relayer schema check`` run by a role that lacks a privilege it needs: one line saying which
privilege and what to do, exit 2, no traceback (the database's default privileges for PUBLIC
are revoked, so a role has only what `schema grants` printed for it)."""

from __future__ import annotations

from pathlib import Path

from relayer.settings import StoreSettings
from tests.acceptance.cli import environment
from tests.badinput.support import CliCase, error_line, run_cases
from tests.integration.test_grants import RoleMaker, owner_store, role_of  # noqa: F401 (fixtures)


def test_schema_check_without_a_privilege_says_which(
    role_of: RoleMaker,  # noqa: F811
    tmp_path: Path,
) -> None:
    worker: StoreSettings = role_of("worker", without_temp=True)
    operator: StoreSettings = role_of("operator")
    role = worker.require_dsn().split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]
    database = worker.require_dsn().rsplit("/", 1)[1].split("?", 1)[0]
    cases = [
        CliCase("worker", ("schema", "check", "orders"), env=environment(worker)),
        CliCase("operator", ("schema", "check", "orders"), env=environment(operator)),
    ]
    results = run_cases(cases, tmp_path)
    assert error_line(results["worker"]) == (
        f"relayer: error: store 'orders': schema check needs the TEMPORARY privilege on "
        f"database {database!r}, which role {role!r} lacks (it builds this version's tables "
        "as temporary tables to compare them with the store's); run it as the tables' owner, "
        f'or GRANT TEMPORARY ON DATABASE "{database}" TO "{role}"'
    )
    line = error_line(results["operator"])
    assert line.startswith("relayer: error: store 'orders': schema check: permission denied "), line
    assert line.endswith("; run it as the tables' owner (it reads every table of the store)")
