"""``relayer run --processes N`` as an operator uses it: N members from one command."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from relayer.settings import StoreSettings
from tests.acceptance.cli import command, relayer
from tests.acceptance.test_run_cli import memory_store, wait_until, worker_env
from tests.integration.relay.helpers import pending, write

__all__ = ["memory_store"]  # the fixture, shared with test_run_cli


def owners(store: StoreSettings, condition: str) -> set[str]:
    """The owners of the lease rows matching ``condition`` (a constant SQL condition)."""
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute(f"SELECT owner FROM orders_leases WHERE {condition}").fetchall()
    return {row[0] for row in rows}


def live_members(store: StoreSettings) -> set[str]:
    return owners(store, "lane IS NULL AND expires_at > pg_catalog.now()")


def lane_owners(store: StoreSettings) -> set[str]:
    """The member that last held each lane (leases of idle lanes expire, their owner stays)."""
    return owners(store, "lane IS NOT NULL AND owner <> ''")


def member_pid(member: str) -> int:
    """The pid in a default member id (host:pid:random)."""
    return int(member.split(":")[-2])


@contextlib.contextmanager
def running(store: StoreSettings, log: Path, *arguments: str) -> Iterator[subprocess.Popen[str]]:
    """``relayer run orders ARGUMENTS`` (log lines to ``log``) until SIGTERM at the end."""
    with log.open("w") as stderr:  # the child keeps its own copy of the descriptor
        parent = subprocess.Popen(
            command("run", "orders", *arguments),
            env=worker_env(store),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
        )
    try:
        yield parent
    finally:
        parent.send_signal(signal.SIGTERM)
        parent.wait(timeout=60)


def test_two_processes_join_drain_and_stop_together_on_sigterm(
    memory_store: StoreSettings, tmp_path: Path
) -> None:
    log = tmp_path / "relayer.log"
    keys = [f"key-{index}" for index in range(40)]
    write(memory_store, keys, per_key=5)
    with running(memory_store, log, "--processes", "2") as parent:
        wait_until(lambda: len(live_members(memory_store)) == 2, 30)
        wait_until(lambda: pending(memory_store) == 0, 30)
        members = live_members(memory_store)
        assert parent.pid not in {member_pid(member) for member in members}

        def both_sending() -> bool:
            # Rows keep coming (woken by NOTIFY) until each member sent lanes of its share: the
            # first member to join may send every lane until its next heartbeat.
            write(memory_store, keys)
            return lane_owners(memory_store) == members

        wait_until(both_sending, 30)
        wait_until(lambda: pending(memory_store) == 0, 30)
    text = log.read_text()
    assert parent.returncode == 0, text
    assert live_members(memory_store) == set()
    assert text.count("left store orders") == 2
    assert "Traceback" not in text


def test_a_child_that_dies_is_logged_and_restarted_while_the_other_keeps_going(
    memory_store: StoreSettings, tmp_path: Path
) -> None:
    log = tmp_path / "relayer.log"
    with running(memory_store, log, "--processes", "2") as parent:
        wait_until(lambda: len(live_members(memory_store)) == 2, 30)
        first = live_members(memory_store)
        victim = sorted(first)[0]
        survivor = sorted(first)[1]
        os.kill(member_pid(victim), signal.SIGKILL)
        wait_until(lambda: "exited unexpectedly with status 137" in log.read_text(), 30)
        # A new member replaces it; the survivor never left.
        wait_until(lambda: len(live_members(memory_store) - first) == 1, 30)
        assert survivor in live_members(memory_store)
        write(memory_store, [f"key-{index}" for index in range(20)])
        wait_until(lambda: pending(memory_store) == 0, 30)
    text = log.read_text()
    # Every process's last exit was graceful: the restarted one and the survivor.
    assert parent.returncode == 0, text
    assert "restarting it in 1 s (restart 1 of at most 5 in a row)" in text


def test_a_configuration_error_exits_2_once_before_any_process_starts(
    memory_store: StoreSettings,
) -> None:
    result = relayer("run", "orders", "billing", "--processes", "3", env=worker_env(memory_store))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "billing" in result.stderr
    assert live_members(memory_store) == set()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--processes", "0"], "'0' is not a process count (1-1024 or auto)"),
        (["--processes", "many"], "'many' is not a process count (1-1024 or auto)"),
        (
            ["--processes", "4", "--metrics-port", "65534"],
            "--metrics-port: 65534 is invalid with --processes 4: process i serves PORT+i, so "
            "PORT must be at most 65532",
        ),
    ],
)
def test_bad_process_options_exit_2_naming_the_value(
    memory_store: StoreSettings, arguments: list[str], message: str
) -> None:
    result = relayer("run", "orders", *arguments, env=worker_env(memory_store))
    assert result.returncode == 2
    assert message in result.stderr
