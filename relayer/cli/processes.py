"""``relayer run --processes N``: N member processes from one command, supervised.

Each child is ``relayer run`` itself (the same stores and settings, ``--processes 1``): a full
worker with its own member id and connections. The parent forwards SIGTERM/SIGINT to every
child and waits for each to stop gracefully, within ``lease_duration / 2`` plus
:data:`STOP_MARGIN` seconds (then it kills the child). A child that exits while the parent is
not stopping is restarted after a backoff (1 s, doubling up to :data:`MAX_BACKOFF`), at most
:data:`MAX_RESTARTS` times in a row (a child that ran :data:`STABLE_AFTER` seconds starts the
count again); a child that exits 2 (bad configuration) is not restarted. The parent exits with
the worst status of its children's last exits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from relayer.cli.common import EXIT_OK, EXIT_USAGE

logger = logging.getLogger(__name__)

MAX_RESTARTS = 5
MAX_BACKOFF = 30.0
STABLE_AFTER = 60.0
STOP_MARGIN = 10.0
# Set in a child's environment: the parent's pid (the child stops if the parent dies).
SUPERVISOR_ENV = "RELAYER_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1


@dataclass(slots=True)
class Child:
    """One supervised slot: its command and how its last process ended."""

    index: int
    command: Sequence[str]
    status: int = EXIT_OK
    restarts: int = 0


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it (128 + N when killed by signal N)."""
    return 128 - returncode if returncode < 0 else returncode


def restart_delay(failures: int, first: float = 1.0) -> float:
    """The backoff before restart number ``failures`` (1, 2, 4 ... MAX_BACKOFF seconds)."""
    return min(first * 2.0 ** (failures - 1), MAX_BACKOFF)


class Supervisor:
    """Runs ``commands`` as child processes until ``stop`` is set (see the module docstring)."""

    def __init__(
        self,
        commands: Sequence[Sequence[str]],
        *,
        stop_within: float,
        env: Mapping[str, str] | None = None,
        max_restarts: int = MAX_RESTARTS,
        first_backoff: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = [Child(index, command) for index, command in enumerate(commands)]
        self.stop_within = stop_within
        self.env = {**(env if env is not None else os.environ), SUPERVISOR_ENV: str(os.getpid())}
        self.max_restarts = max_restarts
        self.first_backoff = first_backoff
        self.clock = clock
        self.signal = signal.SIGTERM
        self.pids: dict[int, int] = {}  # index -> pid of the running process

    async def run(self, stop: asyncio.Event) -> int:
        """Keep every child running until ``stop``; the worst status of their last exits."""
        async with asyncio.TaskGroup() as tasks:
            for child in self.children:
                tasks.create_task(self._keep(child, stop))
        return max(child.status for child in self.children)

    def forward(self, signum: int) -> None:
        """Send ``signum`` to every running child (the parent got it)."""
        self.signal = signal.Signals(signum)
        for pid in self.pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    async def _keep(self, child: Child, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            started = self.clock()
            process = await asyncio.create_subprocess_exec(*child.command, env=self.env)
            self.pids[child.index] = process.pid
            logger.info(
                "process %s started (pid %s)",
                child.index,
                process.pid,
                extra={"action": "process_start"},
            )
            try:
                child.status = exit_status(await self._wait(child, process, stop))
            finally:
                self.pids.pop(child.index, None)
            if stop.is_set():
                return
            if self.clock() - started >= STABLE_AFTER:
                failures = 0
            failures += 1
            if child.status == EXIT_USAGE or failures > self.max_restarts:
                why = (
                    "bad configuration"
                    if child.status == EXIT_USAGE
                    else f"{self.max_restarts} restarts in a row"
                )
                logger.error(
                    "process %s (pid %s) exited with status %s; not restarted (%s): see its "
                    "last lines above; the other processes keep running",
                    child.index,
                    process.pid,
                    child.status,
                    why,
                    extra={"action": "process_given_up"},
                )
                return
            delay = restart_delay(failures, self.first_backoff)
            logger.error(
                "process %s (pid %s) exited unexpectedly with status %s; restarting it in "
                "%.0f s (restart %s of at most %s in a row)",
                child.index,
                process.pid,
                child.status,
                delay,
                failures,
                self.max_restarts,
                extra={"action": "process_exited"},
            )
            child.restarts += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    async def _wait(
        self, child: Child, process: asyncio.subprocess.Process, stop: asyncio.Event
    ) -> int:
        """The process's return code; once ``stop`` is set, signal it and wait at most
        ``stop_within`` seconds before killing it."""
        exited = asyncio.ensure_future(process.wait())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if exited.done():
                return exited.result()
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(self.signal)
            try:
                return await asyncio.wait_for(asyncio.shield(exited), self.stop_within)
            except TimeoutError:
                logger.error(
                    "process %s (pid %s) did not stop within %.1f s; killing it (its leases "
                    "expire within lease_duration)",
                    child.index,
                    process.pid,
                    self.stop_within,
                    extra={"action": "process_killed"},
                )
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                return await exited
        finally:
            stopping.cancel()
            if not exited.done():  # the parent itself is being cancelled
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                exited.cancel()


def child_command(arguments: argparse.Namespace, index: int) -> list[str]:
    """The ``relayer run`` command line of child ``index``: the parent's options with
    ``--processes 1``, ``--instance-id ID-INDEX`` and ``--metrics-port PORT+INDEX``."""
    command = [sys.executable, "-m", "relayer"]
    for option, value in (
        ("--config", arguments.config),
        ("--log-level", arguments.log_level),
        ("--log-format", arguments.log_format),
    ):
        if value:
            command += [option, value]
    command += ["run", *arguments.stores, "--processes", "1"]
    if arguments.template:
        command += ["--template", ",".join(arguments.template)]
    if arguments.instance_id:
        command += ["--instance-id", f"{arguments.instance_id}-{index}"]
    port = arguments.metrics_port
    if port is not None:
        command += [
            "--metrics-port",
            str(port + index if port else 0),  # 0: each child binds a free port of its own
            "--metrics-host",
            arguments.metrics_host,
            "--metrics-interval",
            str(arguments.metrics_interval),
            "--metrics-top-lanes",
            str(arguments.metrics_top_lanes),
        ]
    return command


def stop_with_supervisor() -> bool:
    """In a child of a supervisor: ask the kernel for a SIGTERM when the parent dies (Linux),
    so that no worker outlives it. False when the parent is already gone."""
    parent = os.environ.get(SUPERVISOR_ENV)
    if not parent:
        return True
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    return str(os.getppid()) == parent
