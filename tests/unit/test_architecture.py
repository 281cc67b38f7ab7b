"""The store gateway is the only way to the database: no module of relayer outside relayer/store/
runs a statement, catches a driver error or imports the driver (the few listed below import a
part of it, or catch one error of it, for a reason given there). And relayer's modules import
each other without a cycle.

Every module is checked, found by globbing: a new one is covered without being listed.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "relayer"
GATEWAY = PACKAGE / "store"
OUTSIDE_THE_GATEWAY = sorted(path for path in PACKAGE.rglob("*.py") if GATEWAY not in path.parents)
DRIVER_MODULES = ("psycopg", "psycopg_pool")
# The parts of the driver a module outside the gateway may import, and why: none of them opens
# a connection, runs a statement or catches a driver error.
DRIVER_IMPORTS_ALLOWED: Mapping[str, tuple[frozenset[str], str]] = {
    "relayer/sql/__init__.py": (
        frozenset({"psycopg.sql"}),
        "composes a store's identifiers into the named queries' text",
    ),
    "relayer/operations/schema.py": (
        frozenset({"psycopg.sql"}),
        "composes the DDL script `relayer schema print` shows",
    ),
    "relayer/operations/grants.py": (
        frozenset({"psycopg.sql", "psycopg.conninfo"}),
        "composes the GRANT text `relayer schema grants` prints, for the DSN's database",
    ),
    "relayer/pooler.py": (
        frozenset({"psycopg.conninfo", "psycopg.errors"}),
        "reads the host, port, database and options a DSN names, and whether it parses",
    ),
}
# The driver errors a module outside the gateway may catch (its except clauses, as written), and
# why: none of them comes from a connection.
DRIVER_CATCHES_ALLOWED: Mapping[str, tuple[frozenset[str], str]] = {
    "relayer/pooler.py": (
        frozenset({"except ProgrammingError"}),
        "a DSN libpq cannot parse is a configuration error; no connection is involved",
    ),
}
# Application code shipped in the package: it runs its own statements on its own tables, as an
# application does, and reaches relayer's tables through the gateway.
PLAYS_THE_APPLICATION: Mapping[str, str] = {
    "relayer/demo.py": "the demo's orders table, written in its transactions beside Outbox's rows",
}
# Modules whose calls of those names go to another server, and which: they import no part of
# the driver (the import test checks it), so no such call reaches PostgreSQL.
OTHER_SERVERS_CALLS: Mapping[str, tuple[frozenset[str], str]] = {
    "relayer/transports/redis/writer.py": (
        frozenset({"pipeline", "execute"}),
        "a Redis pipeline of XADDs and its execution",
    ),
}
# What running a statement or a transaction looks like on a psycopg connection or cursor.
DATABASE_CALLS = frozenset(
    {
        "execute",
        "executemany",
        "commit",
        "rollback",
        "transaction",
        "pipeline",
        "cursor",
        "notifies",
        "set_autocommit",
        "set_read_only",
        "set_isolation_level",
        "set_deferrable",
    }
)
# Names a module may catch driver errors under besides the driver's own: the gateway's tuple.
GATEWAY_ERROR_NAMES = frozenset({"DRIVER_ERRORS"})


def name(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


def module_of(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _tree(path: Path) -> ast.Module:
    """The module without its ``if TYPE_CHECKING:`` blocks (annotations only: no use)."""
    tree = ast.parse(path.read_text("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = [ast.Pass()]
    return tree


def _imports(tree: ast.Module) -> list[tuple[str, str, str]]:
    """(module, name or "", local name bound) of every import at any depth: ``import a.b``
    is ("a.b", "", "a"), ``from a import b as c`` is ("a", "b", "c")."""
    found: list[tuple[str, str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, "", alias.asname or alias.name.split(".")[0]))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                found.append((node.module, alias.name, alias.asname or alias.name))
    return found


def _is_driver(module: str) -> bool:
    return module.split(".", maxsplit=1)[0] in DRIVER_MODULES


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent is a module, not a package
        return False


def driver_imports(tree: ast.Module) -> list[str]:
    """The parts of the driver imported: ``from psycopg import sql`` imports ``psycopg.sql``
    (a module), ``from psycopg import ProgrammingError`` imports ``psycopg``."""
    found: set[str] = set()
    for module, imported, _ in _imports(tree):
        if _is_driver(module):
            submodule = f"{module}.{imported}"
            found.add(submodule if imported and _is_module(submodule) else module)
    return sorted(found)


def database_calls(tree: ast.Module) -> list[str]:
    """Calls that run a statement or a transaction (``copy`` only with an argument: a COPY
    statement, not a mapping's copy)."""
    calls = {
        (node.lineno, node.func.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (
            node.func.attr in DATABASE_CALLS
            or node.func.attr.startswith("fetch")
            or (node.func.attr == "copy" and bool(node.args))
        )
    }
    return [f"line {line}: .{attribute}()" for line, attribute in sorted(calls)]


def _clause(catch: str) -> str:
    """A found catch without its line number: ``except ProgrammingError``."""
    return catch.split(": ", maxsplit=1)[1]


def driver_catches(tree: ast.Module) -> list[str]:
    """``except`` clauses and ``suppress(...)`` calls naming a driver error."""
    driver_names = {local for module, _, local in _imports(tree) if _is_driver(module)}
    driver_names |= GATEWAY_ERROR_NAMES

    def names_driver(node: ast.AST) -> bool:
        return any(
            isinstance(part, ast.Name) and part.id in driver_names for part in ast.walk(node)
        )

    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type and names_driver(node.type):
            found.add(f"line {node.lineno}: except {ast.unparse(node.type)}")
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).split(".")[-1] == "suppress"
            and any(names_driver(argument) for argument in node.args)
        ):
            found.add(f"line {node.lineno}: {ast.unparse(node)}")
    return sorted(found)


@pytest.mark.parametrize(
    "path",
    [path for path in OUTSIDE_THE_GATEWAY if name(path) not in PLAYS_THE_APPLICATION],
    ids=name,
)
def test_no_statement_outside_the_gateway(path: Path) -> None:
    others = OTHER_SERVERS_CALLS.get(name(path), (frozenset(), ""))[0]
    found = [
        call for call in database_calls(_tree(path)) if call.rsplit(".", 1)[-1][:-2] not in others
    ]
    assert not found, f"{name(path)} runs statements itself (use relayer.store): {found}"


@pytest.mark.parametrize("path", OUTSIDE_THE_GATEWAY, ids=name)
def test_no_driver_error_is_caught_outside_the_gateway(path: Path) -> None:
    allowed = DRIVER_CATCHES_ALLOWED.get(name(path), (frozenset(), ""))[0]
    found = [catch for catch in driver_catches(_tree(path)) if _clause(catch) not in allowed]
    assert not found, (
        f"{name(path)} handles driver errors itself (relayer.store translates them): {found}"
    )


@pytest.mark.parametrize("path", OUTSIDE_THE_GATEWAY, ids=name)
def test_no_driver_import_outside_the_gateway_unless_allowed(path: Path) -> None:
    allowed = DRIVER_IMPORTS_ALLOWED.get(name(path), (frozenset(), ""))[0]
    if name(path) in PLAYS_THE_APPLICATION:
        allowed = frozenset({"psycopg.sql"})  # the identifiers of its own tables
    found = [module for module in driver_imports(_tree(path)) if module not in allowed]
    assert not found, f"{name(path)} imports the driver: {found}"


def test_the_lists_name_modules_that_exist() -> None:
    """An entry left behind by a rename or a move would exempt nothing, silently."""
    names = [name(path) for path in OUTSIDE_THE_GATEWAY]
    for listed in (
        *DRIVER_IMPORTS_ALLOWED,
        *DRIVER_CATCHES_ALLOWED,
        *PLAYS_THE_APPLICATION,
        *OTHER_SERVERS_CALLS,
    ):
        assert listed in names, f"{listed} is listed but is not a module outside relayer/store/"


def test_the_allowed_catches_are_there() -> None:
    """An allowance its module no longer needs would excuse the next such catch, silently."""
    for listed, (allowed, _) in DRIVER_CATCHES_ALLOWED.items():
        found = {_clause(catch) for catch in driver_catches(_tree(PACKAGE.parent / listed))}
        assert allowed <= found, f"{listed} no longer has {sorted(allowed - found)}"


# -- import cycles -------------------------------------------------------------------------------


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module of ``package`` -> the modules of it that it imports (at any depth, but not
    under TYPE_CHECKING). ``from relayer.x import y`` imports ``relayer.x.y`` when that is a
    module, else ``relayer.x``."""
    trees = {module_of(path, package): _tree(path) for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, tree in trees.items():
        targets: set[str] = set()
        for imported, imported_name, _ in _imports(tree):
            submodule = f"{imported}.{imported_name}"
            target = submodule if imported_name and submodule in trees else imported
            if target in trees and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted (Tarjan)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = lowest[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                lowest[module] = min(lowest[module], lowest[target])
            elif target in stack:
                lowest[module] = min(lowest[module], index[target])
        if lowest[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_import_cycle() -> None:
    assert cycles(import_graph(PACKAGE)) == []


def test_the_library_imports_nothing_from_the_cli() -> None:
    """The CLI is a thin layer over the library: the dashboard, and every other package, take
    nothing from it (what both need lives in the library, e.g. relayer.operations)."""
    graph = import_graph(PACKAGE)
    found = sorted(
        f"{module} -> {imported}"
        for module, imports in graph.items()
        if not module.startswith("relayer.cli") and module != "relayer.__main__"
        for imported in imports
        if imported.startswith("relayer.cli")
    )
    assert found == []


# -- the checks themselves ---------------------------------------------------------------------


def test_the_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The checks above catch the code they forbid (so the tests can fail)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import contextlib\n"
        "from typing import TYPE_CHECKING\n"
        "import psycopg\n"
        "from psycopg_pool import PoolTimeout\n"
        "if TYPE_CHECKING:\n"
        "    from psycopg.rows import Row\n"
        "async def f(conn, headers):\n"
        "    try:\n"
        "        await conn.execute('SELECT 1')\n"
        "        async with conn.cursor() as cursor, cursor.copy('COPY t FROM STDIN'):\n"
        "            pass\n"
        "        headers.copy()\n"
        "    except (OSError, psycopg.OperationalError):\n"
        "        pass\n"
        "    except PoolTimeout:\n"
        "        pass\n"
        "    with contextlib.suppress(psycopg.Error):\n"
        "        await (await conn.execute('SELECT 2')).fetchone()\n"
        "    from psycopg import sql, ProgrammingError\n",
        "utf-8",
    )
    tree = _tree(sample)
    assert driver_imports(tree) == ["psycopg", "psycopg.sql", "psycopg_pool"]
    assert database_calls(tree) == [
        "line 9: .execute()",
        "line 10: .copy()",
        "line 10: .cursor()",
        "line 18: .execute()",
        "line 18: .fetchone()",
    ]
    assert driver_catches(tree) == [
        "line 13: except (OSError, psycopg.OperationalError)",
        "line 15: except PoolTimeout",
        "line 17: contextlib.suppress(psycopg.Error)",
    ]


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    package = tmp_path / "relayer"
    (package / "x").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "x" / "__init__.py").write_text("from relayer.x.b import B\n")
    (package / "a.py").write_text("def f():\n    from relayer.x import b\n")
    (package / "x" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "import relayer.c\n"
        "if TYPE_CHECKING:\n"
        "    from relayer import a\n"
    )
    (package / "c.py").write_text("from relayer.a import f\n")
    graph = import_graph(package)
    assert graph["relayer.a"] == {"relayer.x.b"}  # a submodule, not the package
    assert graph["relayer.x.b"] == {"relayer.c"}  # not the TYPE_CHECKING import
    assert cycles(graph) == [["relayer.a", "relayer.c", "relayer.x.b"]]
