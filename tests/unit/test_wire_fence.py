"""relayer.store.wire takes libpq's pipeline only with the psycopg releases it was tested with,
the ones pyproject.toml pins; any other takes psycopg's cursors."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from relayer.store import libpq_pipeline, wire

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version", ["3.2", "3.2.0", "3.2.13", "3.3.0", "3.3.9"])
def test_a_tested_release_takes_the_fast_path(version: str) -> None:
    assert libpq_pipeline.fast_path_problem(version) is None


@pytest.mark.parametrize("version", ["3.1.20", "3.4.0", "3.30.1", "4.0.0"])
def test_any_other_release_says_which_it_is_and_what_to_install(version: str) -> None:
    problem = libpq_pipeline.fast_path_problem(version)
    assert problem is not None
    assert f"psycopg {version} is not one the fast path was tested with (3.2.x, 3.3.x)" in problem
    assert "pip install 'psycopg[binary,pool]>=3.2,<3.4'" in problem


def test_pyproject_pins_the_tested_releases() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    pins = [spec for spec in project["dependencies"] if spec.startswith("psycopg")]
    assert pins == [libpq_pipeline.tested_requirement()]


def test_the_process_path_follows_the_installed_psycopg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "installed_psycopg", lambda: "3.3.9")
    tested = wire.WirePath.for_this_process(environ={})
    assert (tested.public, tested.problem) == (False, None)
    monkeypatch.setattr(wire, "installed_psycopg", lambda: "3.4.1")
    other = wire.WirePath.for_this_process(environ={})
    assert other.public
    assert other.problem is not None and "psycopg 3.4.1" in other.problem


def test_the_tests_can_force_the_public_path_without_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire, "installed_psycopg", lambda: "3.3.9")
    forced = wire.WirePath.for_this_process(environ={wire.FORCE_VARIABLE: "public"})
    assert (forced.public, forced.problem) == (True, None)
    default = wire.WirePath.for_this_process(environ={wire.FORCE_VARIABLE: "fast"})
    assert not default.public
