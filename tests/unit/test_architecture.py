"""The store gateway is the only way to the database: the relay, the worker, membership,
unordered sending and maintenance run no SQL and handle no driver error themselves."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "relayer"
# Modules that reach the database only through relayer.store.
GATEWAY_USERS = sorted(
    [
        *(PACKAGE / "relay").glob("*.py"),
        *(PACKAGE / "worker").glob("*.py"),
    ]
)
# after_commit.py reads the status of the application's own connection (psycopg.pq), but sends
# through the gateway too: it catches no driver error either.
CATCHING_NO_DRIVER_ERROR = [*GATEWAY_USERS, PACKAGE / "writer" / "after_commit.py"]
DRIVER_MODULES = ("psycopg", "psycopg_pool")
# What running a statement or a transaction looks like on a psycopg connection or cursor.
DATABASE_CALLS = {
    "execute",
    "executemany",
    "fetchone",
    "fetchmany",
    "fetchall",
    "commit",
    "rollback",
    "transaction",
    "pipeline",
    "cursor",
    "notifies",
}

DRIVER_CATCH = re.compile(r"except\s*\(?[^:\n]*\bpsycopg\w*|psycopg\.Error|PoolTimeout")


def name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


@pytest.mark.parametrize("path", CATCHING_NO_DRIVER_ERROR, ids=name)
def test_no_driver_error_is_caught_outside_the_gateway(path: Path) -> None:
    source = path.read_text("utf-8")
    found = DRIVER_CATCH.findall(source)
    assert not found, f"{name(path)} handles driver errors itself: {found}"
    assert "DATABASE_TROUBLE" not in source


def _top_level_imports(tree: ast.Module) -> list[str]:
    """Modules imported outside ``if TYPE_CHECKING:`` blocks."""
    imported: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []  # annotations only: not a use of the driver
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
    return imported


def _database_calls(tree: ast.Module) -> list[str]:
    return sorted(
        {
            f"line {node.lineno}: .{node.func.attr}()"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in DATABASE_CALLS
        }
    )


@pytest.mark.parametrize("path", GATEWAY_USERS, ids=name)
def test_no_driver_import_and_no_statement_outside_the_gateway(path: Path) -> None:
    tree = ast.parse(path.read_text("utf-8"))
    drivers = [
        module for module in _top_level_imports(tree) if module.split(".")[0] in DRIVER_MODULES
    ]
    assert not drivers, f"{name(path)} imports the driver: {drivers}"
    calls = _database_calls(tree)
    assert not calls, f"{name(path)} runs statements itself (use relayer.store): {calls}"


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The patterns above catch the code they forbid (so the tests can fail)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import psycopg\n"
        "async def f(conn):\n"
        "    try:\n"
        "        await conn.execute('SELECT 1')\n"
        "    except (OSError, psycopg.OperationalError):\n"
        "        pass\n",
        "utf-8",
    )
    source = sample.read_text("utf-8")
    assert DRIVER_CATCH.findall(source) == ["except (OSError, psycopg"]
    tree = ast.parse(source)
    assert _top_level_imports(tree) == ["psycopg"]
    assert _database_calls(tree) == ["line 4: .execute()"]
