"""Keeps ``opentelemetry-instrument relayer --config FILE ...`` working.

``opentelemetry-instrument`` parses its own command line with argparse: one option per
OpenTelemetry environment variable that installed packages declare through the
``opentelemetry_environment_variables`` entry points (``OTEL_PYTHON_CONFIGURATOR`` becomes
``--configurator``, ``OTEL_CONFIG_FILE`` ``--config_file``), then the command to run and its
arguments. argparse looks at every argument first, the command's too, and accepts unambiguous
abbreviations of its options; ``--config`` abbreviates two of them, so the wrapper stopped with
"ambiguous option: --config could match --configurator, --config_file" before relayer started.

An option spelled exactly ``--config`` is no abbreviation. This module is such an entry point
(see pyproject.toml): it declares ``OTEL_PYTHON_CONFIG``, which gives the wrapper a
``--config`` option of its own, so argparse takes relayer's ``--config`` as that exact option,
and, since it comes after the command, hands it to the command with the command's other
arguments. Nothing reads ``OTEL_PYTHON_CONFIG``: given before the command (``opentelemetry-
instrument --config FILE relayer ...``) the option only sets that variable; put it after.

If another installed package declares the same option, this module declares nothing (argparse
refuses an option declared twice, and that one makes ``--config`` exact already).
"""

from __future__ import annotations

import re
from importlib.metadata import entry_points

GROUP = "opentelemetry_environment_variables"
OTEL_PYTHON_CONFIG = "OTEL_PYTHON_CONFIG"
_OPTION = "config"


def option_name(variable: str) -> str:
    """The wrapper's option for an OpenTelemetry variable, as it derives it (without ``--``)."""
    return re.sub(r"OTEL_(PYTHON_)?", "", variable).lower()


def declared_elsewhere() -> bool:
    """Whether another installed entry point of the group declares ``--config`` too."""
    for entry_point in entry_points(group=GROUP):
        if entry_point.value == __name__:
            continue
        try:
            module = entry_point.load()
        except Exception:  # the wrapper reports a broken entry point itself
            continue
        if any(name.startswith("OTEL_") and option_name(name) == _OPTION for name in dir(module)):
            return True
    return False


def __dir__() -> list[str]:
    # The wrapper reads the variables it offers as options from dir(module).
    names = ["GROUP", "declared_elsewhere", "option_name"]
    return names if declared_elsewhere() else [*names, OTEL_PYTHON_CONFIG]
