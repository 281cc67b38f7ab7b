"""Every RELAYER_ variable relayer itself reads is one the start-up check accepts, and every
option of `relayer run` has its variable, documented."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from relayer.cli import build_parser
from relayer.cli.common import resolve_environment
from relayer.environment import DASHBOARD_OPTIONS, NOT_SETTINGS, RESERVED_PREFIXES, RUN_OPTIONS

PACKAGE = Path(__file__).resolve().parents[2] / "relayer"


def test_every_variable_relayer_reads_is_accepted() -> None:
    read = {
        name
        for path in PACKAGE.rglob("*.py")
        for name in re.findall(r"\"(RELAYER_[A-Z_]+)\"", path.read_text())
    }
    refused = {
        name
        for name in read
        if name not in NOT_SETTINGS
        and not name.startswith(RESERVED_PREFIXES)
        and name != "RELAYER_"
    }
    assert refused == set()


def _run_parser(name: str = "run") -> argparse.ArgumentParser:
    commands = next(
        action
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    parser: argparse.ArgumentParser = commands.choices[name]
    return parser


def test_every_option_of_run_has_its_environment_variable() -> None:
    """`relayer run --metrics-port` is RELAYER_METRICS_PORT, and so on for every option."""
    parser = _run_parser()
    flags = {
        flag
        for action in parser._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }
    options = parser.get_default("environment_options")
    variables = {option.flag: option.variable for option in options}
    assert variables == {flag: "RELAYER_" + flag[2:].upper().replace("-", "_") for flag in flags}
    assert set(variables.values()) == set(RUN_OPTIONS)


def test_the_run_variables_are_documented() -> None:
    cli = (PACKAGE.parent / "docs" / "cli.md").read_text()
    assert [name for name in RUN_OPTIONS if f"`{name}`" not in cli] == []


def test_the_dashboard_options_from_the_environment_are_listed_and_documented() -> None:
    """`relayer dashboard --template` is RELAYER_DASHBOARD_TEMPLATE (beside
    RELAYER_DASHBOARD_TOKEN), accepted by the start-up check and documented."""
    options = _run_parser("dashboard").get_default("environment_options")
    variables = {option.flag: option.variable for option in options}
    assert variables == {"--template": "RELAYER_DASHBOARD_TEMPLATE"}
    assert set(variables.values()) == set(DASHBOARD_OPTIONS)
    for page in ("cli.md", "dashboard.md"):
        text = (PACKAGE.parent / "docs" / page).read_text()
        assert [name for name in DASHBOARD_OPTIONS if f"`{name}`" not in text] == [], page


def test_the_environment_wins_over_the_default_and_the_command_line_over_both() -> None:
    parser = build_parser()
    environ = {"RELAYER_METRICS_PORT": "9464", "RELAYER_PROCESSES": "auto"}
    from_environment = parser.parse_args(["run", "orders"])
    resolve_environment(from_environment, environ)
    assert from_environment.metrics_port == 9464
    assert from_environment.processes == (os.cpu_count() or 1)
    assert from_environment.metrics_host == "0.0.0.0"  # unset: the default
    given = parser.parse_args(["run", "orders", "--metrics-port", "9000"])
    resolve_environment(given, {**environ, "RELAYER_METRICS_HOST": ""})  # empty: unset
    assert (given.metrics_port, given.metrics_host) == (9000, "0.0.0.0")
