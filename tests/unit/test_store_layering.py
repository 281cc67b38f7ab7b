"""The store gateway sits below the packages that use it: a module of relayer/store/ imports only
the gateway itself and the few modules below it (settings, SQL, errors, identifiers and the
like), never dispatch, operations, the relay, the worker, the dashboard, the CLI, fleet or the
writer. The values it returns are its own; what they mean is decided above it.

Every module of relayer/store/ is checked, found by globbing; imports at any depth count (a
function-level import still makes the gateway depend on its caller), except those under
``if TYPE_CHECKING:``, which are annotations only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "relayer"
GATEWAY_MODULES = sorted((PACKAGE / "store").rglob("*.py"))
# What the gateway may import of relayer: itself and what sits below it.
BELOW_THE_GATEWAY = (
    "relayer.store",
    "relayer.sql",
    "relayer.settings",
    "relayer.errors",
    "relayer.identifiers",
    "relayer.redact",
    "relayer.lanes",
    "relayer.ids",  # UUIDv7 message ids, made as rows are written
    "relayer.deadlines",
    "relayer.pooler",
    "relayer.tasks",
    "relayer.transports.base",  # value types: the outbound batch and messages
    "relayer.observability.throttle",  # a logging utility
)


def _package_of(path: Path, package: Path) -> list[str]:
    """The package a module of ``package`` resolves its relative imports from."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return list(parts if parts[-1] == "__init__" else parts[:-1])


def relayer_imports(path: Path, package: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, dotted name) of every import of relayer's in ``path`` (a module of ``package``),
    at any depth but not under TYPE_CHECKING: ``from relayer.a import b`` is ``relayer.a.b``
    (a module or a name of it), relative imports resolved from the module's package."""
    tree = ast.parse(path.read_text("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = [ast.Pass()]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = _package_of(path, package)[: 1 - node.level or None]
                base = ".".join([*parent, base] if base else parent)
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return sorted((line, name) for line, name in found if name.split(".")[0] == "relayer")


def _below_the_gateway(name: str) -> bool:
    return any(name == allowed or name.startswith(f"{allowed}.") for allowed in BELOW_THE_GATEWAY)


def upward_imports(path: Path, package: Path = PACKAGE) -> list[str]:
    """The imports of ``path`` (a module of ``package``) that reach above the gateway."""
    return [
        f"line {line}: {name}"
        for line, name in relayer_imports(path, package)
        if not _below_the_gateway(name)
    ]


def _name(path: Path) -> str:
    return path.relative_to(PACKAGE.parent).as_posix()


@pytest.mark.parametrize("path", GATEWAY_MODULES, ids=_name)
def test_the_gateway_imports_nothing_above_it(path: Path) -> None:
    found = upward_imports(path)
    assert not found, f"{_name(path)} imports above the gateway (move it up or pass it in): {found}"


def test_the_check_finds_an_upward_import(tmp_path: Path) -> None:
    """The check above catches what it forbids (so the test can fail), and lets pass what the
    gateway may import."""
    store = tmp_path / "relayer" / "store"
    store.mkdir(parents=True)
    sample = store / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "import relayer.store.driver\n"
        "from relayer.dispatch.control import QueueControl\n"
        "from relayer.settings import StoreSettings\n"
        "from relayer.transports import base\n"
        "from relayer.transports import KafkaTransport\n"
        "from . import wire\n"
        "from ..operations import health\n"
        "import relayer\n"
        "if TYPE_CHECKING:\n"
        "    from relayer.worker import Worker\n"
        "async def f():\n"
        "    from relayer.operations.health import warnings_of\n",
        "utf-8",
    )
    package = tmp_path / "relayer"
    assert [name for _, name in relayer_imports(sample, package)][4:7] == [
        "relayer.transports.KafkaTransport",
        "relayer.store.wire",
        "relayer.operations.health",
    ]
    assert upward_imports(sample, package) == [
        "line 3: relayer.dispatch.control.QueueControl",
        "line 6: relayer.transports.KafkaTransport",
        "line 8: relayer.operations.health",
        "line 9: relayer",
        "line 13: relayer.operations.health.warnings_of",
    ]
