"""Malformed arguments on the command line: each is refused with exit status 2 and one line.

Argument errors (a value an option's type refuses, a missing or unknown argument) print the
error line alone, without argparse's usage block (docs/cli.md: one line naming the field, the
value and the rule); ``--help`` still shows the usage. ``schema grants --role`` refuses names
PostgreSQL would read as another role.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.badinput.support import UNREACHABLE_DSN, CliCase, error_line, run_cases

BASE = {"RELAYER_DSN": UNREACHABLE_DSN, "RELAYER_STORES__ORDERS__TABLE_PREFIX": "orders_"}
GRANTS = ("schema", "grants", "orders", "--for", "writer", "--role")
ROLE_RULE = (
    "must be the name of an existing role: 1 to 63 bytes (PostgreSQL reads only the first 63 "
    "bytes of a longer name, which may name another role), and not 'public' in any case "
    '(GRANT ... TO "public" grants to every role)'
)

# (case, the whole line it must print)
CASES: list[tuple[CliCase, str]] = [
    (
        CliCase("processes-zero", ("run", "orders", "--processes", "0")),
        "relayer run: error: argument --processes: '0' is not a process count (1-1024 or auto); "
        "`relayer run --help` shows the usage",
    ),
    (
        CliCase("metrics-port-not-a-number", ("run", "orders", "--metrics-port", "abc")),
        "relayer run: error: argument --metrics-port: 'abc' is not a TCP port (0-65535); "
        "`relayer run --help` shows the usage",
    ),
    (
        CliCase("max-lag-not-a-duration", ("status", "orders", "--max-lag", "soon")),
        "relayer status: error: argument --max-lag: 'soon' is not a duration (seconds, or a "
        "number with a unit: '250ms', '30s', '5m', '1h'); `relayer status --help` shows the usage",
    ),
    (
        CliCase("dashboard-port-too-big", ("dashboard", "orders", "--port", "70000")),
        "relayer dashboard: error: argument --port: '70000' is not a TCP port (0-65535); "
        "`relayer dashboard --help` shows the usage",
    ),
    (
        CliCase("grants-without-role", ("schema", "grants", "orders", "--for", "writer")),
        "relayer schema grants: error: the following arguments are required: --role; "
        "`relayer schema grants --help` shows the usage",
    ),
    (
        CliCase("unknown-option", ("status", "orders", "--jsn")),
        "relayer: error: unrecognized arguments: --jsn; `relayer --help` shows the usage",
    ),
    (
        CliCase("role-longer-than-postgresql-reads", (*GRANTS, "r" * 64)),
        f"relayer: error: --role: '{'r' * 64}' is invalid: {ROLE_RULE}",
    ),
    (
        CliCase("role-public", (*GRANTS, "public")),
        f"relayer: error: --role: 'public' is invalid: {ROLE_RULE}",
    ),
    (
        CliCase("role-public-in-capitals", (*GRANTS, "PUBLIC")),
        f"relayer: error: --role: 'PUBLIC' is invalid: {ROLE_RULE}",
    ),
    (
        CliCase("role-empty", (*GRANTS, "")),
        f"relayer: error: --role: '' is invalid: {ROLE_RULE}",
    ),
    (
        CliCase("role-of-63-multibyte-bytes-and-one-more", (*GRANTS, "é" * 32)),
        f"relayer: error: --role: '{'é' * 32}' is invalid: {ROLE_RULE}",
    ),
]


@pytest.fixture(scope="module")
def results(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, subprocess.CompletedProcess[str]]:
    directory: Path = tmp_path_factory.mktemp("command-line")
    return run_cases([case for case, _ in CASES], directory, BASE)


@pytest.mark.parametrize(("case", "expected"), CASES, ids=[case.name for case, _ in CASES])
def test_refused_with_one_line(
    case: CliCase, expected: str, results: dict[str, subprocess.CompletedProcess[str]]
) -> None:
    assert error_line(results[case.name]) == expected


def test_an_unknown_command_is_refused_with_one_line_naming_the_commands(tmp_path: Path) -> None:
    line = error_line(run_cases([CliCase("unknown", ("relay",))], tmp_path, BASE)["unknown"])
    assert line.startswith(
        "relayer: error: argument COMMAND: invalid choice: 'relay' (choose from 'schema', 'run', "
    ), line
    assert line.endswith("); `relayer --help` shows the usage"), line


def test_a_role_of_63_bytes_and_a_quoted_name_are_granted_to_as_given(tmp_path: Path) -> None:
    outcomes = run_cases(
        [
            CliCase("longest", (*GRANTS, "r" * 63)),
            CliCase("mixed-case", (*GRANTS, "Public_App")),
        ],
        tmp_path,
        BASE,
    )
    assert outcomes["longest"].returncode == 0, outcomes["longest"].stderr
    assert f'TO "{"r" * 63}";' in outcomes["longest"].stdout
    assert outcomes["mixed-case"].returncode == 0, outcomes["mixed-case"].stderr
    assert 'TO "Public_App";' in outcomes["mixed-case"].stdout


def test_help_still_shows_the_usage(tmp_path: Path) -> None:
    outcomes = run_cases([CliCase("help", ("run", "--help"))], tmp_path)
    assert outcomes["help"].returncode == 0
    assert outcomes["help"].stdout.startswith("usage: relayer run")
