"""`relayer dev`'s refusals: one line naming the option, before any server starts.

What it serves is tested end to end by tests/examples/test_readme.py (the README on `relayer
dev`, stopped with SIGINT, leaving no process behind).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from relayer.cli import main


@pytest.fixture(autouse=True)
def _no_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYER_CONFIG", "")
    monkeypatch.chdir(tmp_path)


def refusal(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str]:
    status = main(["dev", *arguments])
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1, error
    return status, error


@pytest.mark.parametrize(("flag", "what"), [("--pg-port", "PostgreSQL"), ("--kafka-port", "Kafka")])
def test_a_port_in_use_names_it_and_the_option(
    flag: str, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = "--kafka-port" if flag == "--pg-port" else "--pg-port"
        status, error = refusal(capsys, flag, str(port), other, "0")
    assert status == 1
    assert error == (
        f"relayer: 127.0.0.1:{port} is in use (a {what} of your own?); use that one, stop it, "
        f"or give {flag} PORT (0: any free port)\n"
    )


def test_a_database_name_must_be_a_plain_identifier(capsys: pytest.CaptureFixture[str]) -> None:
    status, error = refusal(capsys, "--pg-port", "0", "--database", "-T template0")
    assert status == 2
    assert error.startswith("relayer: error: --database: '-T template0' is invalid: must be a")


def test_write_config_refuses_an_existing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "relayer.toml").write_text("# mine\n")
    status, error = refusal(capsys, "--write-config", "relayer.toml")
    assert status == 2
    assert "--write-config: 'relayer.toml' is invalid: must name a new file" in error
    assert (tmp_path / "relayer.toml").read_text() == "# mine\n"
