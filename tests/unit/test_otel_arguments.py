"""The entry point that gives opentelemetry-instrument an exact ``--config`` option."""

from __future__ import annotations

import types
from typing import Any

import pytest

from relayer import otel_arguments


class FakeEntryPoint:
    def __init__(self, value: str, module: Any) -> None:
        self.value = value
        self.module = module

    def load(self) -> Any:
        return self.module


def declared(monkeypatch: pytest.MonkeyPatch, *others: Any) -> list[str]:
    points = [FakeEntryPoint(otel_arguments.__name__, otel_arguments), *others]
    monkeypatch.setattr(otel_arguments, "entry_points", lambda group: points)
    return [name for name in dir(otel_arguments) if name.startswith("OTEL_")]


def test_it_declares_the_config_option_the_way_the_wrapper_names_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sdk = types.SimpleNamespace(OTEL_PYTHON_CONFIGURATOR="x", OTEL_CONFIG_FILE="y")
    assert declared(monkeypatch, FakeEntryPoint("sdk.environment_variables", sdk)) == [
        "OTEL_PYTHON_CONFIG"
    ]
    assert otel_arguments.option_name("OTEL_PYTHON_CONFIG") == "config"
    assert otel_arguments.option_name("OTEL_CONFIG_FILE") == "config_file"


def test_it_declares_nothing_when_another_package_has_the_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # argparse refuses an option declared twice, which would break the wrapper altogether.
    other = types.SimpleNamespace(OTEL_CONFIG="z")
    assert declared(monkeypatch, FakeEntryPoint("other.variables", other)) == []


def test_a_broken_entry_point_of_another_package_is_left_to_the_wrapper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Broken(FakeEntryPoint):
        def load(self) -> Any:
            raise ImportError("no module named other")

    assert declared(monkeypatch, Broken("other.variables", None)) == ["OTEL_PYTHON_CONFIG"]
