"""The supervisor of ``relayer run --processes``: restarts, their cap, and stopping children,
with small Python programs as children."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

import pytest

from relayer.cli import build_parser
from relayer.cli.common import resolve_environment
from relayer.cli.processes import Supervisor, child_command, exit_status, restart_delay


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_statuses_and_backoff() -> None:
    assert exit_status(0) == 0
    assert exit_status(3) == 3
    assert exit_status(-signal.SIGKILL) == 137
    assert [restart_delay(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [1, 2, 4, 8, 16, 30, 30]


async def test_a_crashing_child_is_restarted_up_to_the_cap_then_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    supervisor = Supervisor(
        [python("raise SystemExit(3)")], stop_within=5, max_restarts=2, first_backoff=0.01
    )
    with caplog.at_level(logging.INFO, logger="relayer"):
        status = await supervisor.run(asyncio.Event())
    assert status == 3
    assert supervisor.children[0].restarts == 2
    assert caplog.text.count("exited unexpectedly with status 3") == 2
    assert "not restarted (2 restarts in a row)" in caplog.text


async def test_a_child_with_bad_configuration_is_not_restarted_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    stop = asyncio.Event()
    supervisor = Supervisor(
        [
            python("raise SystemExit(2)"),
            python(f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"),
        ],
        stop_within=5,
        first_backoff=0.01,
    )
    with caplog.at_level(logging.INFO, logger="relayer"):
        running = asyncio.create_task(supervisor.run(stop))
        async with asyncio.timeout(30):
            while "not restarted (bad configuration)" not in caplog.text or not ready.exists():
                await asyncio.sleep(0.02)
        assert not running.done()  # the second child keeps running
        stop.set()
        status = await running
    assert supervisor.children[0].restarts == 0
    assert supervisor.children[1].status == 128 + signal.SIGTERM  # stopped by the signal
    assert status == 128 + signal.SIGTERM


async def test_a_child_that_ignores_the_signal_is_killed_after_the_bound(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    stop = asyncio.Event()
    code = (
        "import pathlib, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(60)\n"
    )
    supervisor = Supervisor([python(code)], stop_within=0.2)
    with caplog.at_level(logging.INFO, logger="relayer"):
        running = asyncio.create_task(supervisor.run(stop))
        async with asyncio.timeout(30):
            while not ready.exists():
                await asyncio.sleep(0.02)
        stop.set()
        assert await running == 128 + signal.SIGKILL
    assert "did not stop within 0.2 s; killing it" in caplog.text


def test_each_child_runs_the_same_stores_and_templates() -> None:
    arguments = build_parser().parse_args(
        ["run", "orders", "--template", "tenants,partners", "--instance-id", "w"]
    )
    resolve_environment(arguments, {"RELAYER_PROCESSES": "2"})
    assert arguments.processes == 2 and arguments.template == ("tenants", "partners")
    command = child_command(arguments, 1)
    at = command.index("run")
    assert command[at:] == [
        "run",
        "orders",
        "--processes",
        "1",
        "--template",
        "tenants,partners",
        "--instance-id",
        "w-1",
    ]
