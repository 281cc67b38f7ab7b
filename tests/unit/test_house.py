"""The size of the house's rooms: no module of relayer/ over 500 lines, no function over 60,
and worker.py, which only assembles, at most 400 (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "relayer"
MODULES = sorted(PACKAGE.rglob("*.py"))
MODULE_LINES = 500
FUNCTION_LINES = 60
WORKER_LINES = 400


def name(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def lines(path: Path) -> int:
    return len(path.read_text("utf-8").splitlines())


def long_functions(source: str, most: int) -> list[str]:
    """``name (lines)`` of every function in ``source`` longer than ``most`` lines, its
    decorators, signature and docstring included."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(item.lineno for item in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - start + 1
            if length > most:
                found.append(f"{node.name} ({length})")
    return found


@pytest.mark.parametrize("path", MODULES, ids=name)
def test_no_module_is_over_500_lines(path: Path) -> None:
    assert lines(path) <= MODULE_LINES, f"{name(path)}: {lines(path)} lines"


@pytest.mark.parametrize("path", MODULES, ids=name)
def test_no_function_is_over_60_lines(path: Path) -> None:
    assert long_functions(path.read_text("utf-8"), FUNCTION_LINES) == []


def test_the_worker_only_assembles() -> None:
    assert lines(PACKAGE / "worker" / "worker.py") <= WORKER_LINES


def test_the_checks_find_what_they_look_for() -> None:
    """A function one line too long is found, one at the limit is not (so the tests can
    fail)."""
    body = "\n".join(f"    x{number} = {number}" for number in range(FUNCTION_LINES - 1))
    at_limit = f"def fine():\n{body}\n"
    assert long_functions(at_limit, FUNCTION_LINES) == []
    over = f"@decorated\nasync def too_long():\n{body}\n"
    assert long_functions(over, FUNCTION_LINES) == [f"too_long ({FUNCTION_LINES + 1})"]
