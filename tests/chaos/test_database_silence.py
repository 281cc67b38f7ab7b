"""A silent PostgreSQL (issue 34, items 16 and 17): the proxy between the workers and the
database forwards nothing while every TCP connection stays open, as a blackholed network or a
server that stopped answering does. No statement fails; nothing comes back.

- The worker says so: one ``database_stall`` line when its database goes silent (with what to
  check), one ``database_stall_over`` line when it answers again, and nothing is lost.
- SIGTERM while the database is silent, with a batch's outcome statement on its way, stops the
  worker within the documented bound (``lease_duration / 2``, relayer.deadlines) with exit
  status 0; the batch is left to roll back on the server (its lease fences it) and the next
  owner sends its rows.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.chaos.brokers import RabbitTarget
from tests.chaos.checker import RESULTS, Report
from tests.chaos.harness import Run, Settings, live_members, running
from tests.chaos.proxy import (
    FORWARD,
    ClientMessage,
    Link,
    LoopThread,
    Proxy,
    Verdict,
    Watch,
)

SETTINGS = Settings(lease=6.0, retry_backoff=0.5, retry_backoff_max=2.0, keys=200)
WORKERS = 1
FLOWING = 2.0  # seconds of writing before the fault and after it
# The documented stop bound, and one second for the interpreter to exit once the worker has
# stopped (as tests/chaos/test_stall.py allows).
STOP_BOUND = SETTINGS.lease / 2 + 1
WAIT = 60.0  # a generous deadline for what must happen on a busy machine
STALL_SAID = re.compile(r"action=database_stall\]|action=database_stall ")
STALL_OVER = re.compile(r"action=database_stall_over\b")
UNCAUGHT = ("Traceback", "Exception in thread", "never retrieved")


def new_report(request: pytest.FixtureRequest, fault: str, target: RabbitTarget) -> Report:
    name = request.node.name
    report = Report(name, fault, target.name, WORKERS, SETTINGS.batch_size, injections=1)
    report.command = f"pytest tests/chaos/test_database_silence.py -k {name}"
    return report


def wait_for(run: Run, found: re.Pattern[str], what: str, *, since: int = 0) -> None:
    """Until the worker's log (after its first ``since`` characters) matches ``found``."""
    deadline = time.monotonic() + WAIT
    while not found.search(run.workers.logs_of(0)[since:]):
        run.workers.assert_running()
        assert time.monotonic() < deadline, (what, run.workers.tail(0, 40))
        time.sleep(0.1)


def hold(run: Run, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        run.workers.assert_running()
        time.sleep(min(left, 0.2))


def test_a_silent_database_is_said_once_and_so_is_its_return(
    request: pytest.FixtureRequest,
    rabbitmq: RabbitTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    report = new_report(request, "silent PostgreSQL", rabbitmq)
    run = Run(report, pg_dsn, tmp_path, loop, rabbitmq, SETTINGS)
    proxy = run.pg_proxy
    try:
        with running(run):
            hold(run, FLOWING)
            before = len(run.workers.logs_of(0))
            loop.call(proxy.stall)
            try:
                wait_for(run, STALL_SAID, "no database_stall line", since=before)
                # Silent for longer than a lease: still one line for the whole silence.
                hold(run, SETTINGS.lease * 1.5)
            finally:
                loop.call(proxy.resume)
            run.injected()
            wait_for(run, STALL_OVER, "no database_stall_over line", since=before)
            hold(run, FLOWING)
            run.finish()
            lines = run.workers.logs_of(0)[before:].splitlines()
    finally:
        if report.rows:
            RESULTS.append(report)
    said = [line for line in lines if STALL_SAID.search(line)]
    over = [line for line in lines if STALL_OVER.search(line)]
    assert len(said) == 1, said
    assert len(over) == 1, over
    assert "check" in said[0], said[0]
    assert not report.problems(), report.problems()


def test_sigterm_while_the_database_is_silent_stops_within_the_bound(
    request: pytest.FixtureRequest,
    rabbitmq: RabbitTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    report = new_report(request, "SIGTERM with PostgreSQL silent", rabbitmq)
    run = Run(report, pg_dsn, tmp_path, loop, rabbitmq, SETTINGS)
    proxy = run.pg_proxy
    outcome_held = threading.Event()
    stopped_log = ""
    code: int | None = None
    took = float("inf")
    try:
        with running(run):
            hold(run, FLOWING)
            # The database goes silent the moment a batch sends its outcome statement (the
            # fenced delete): the batch waits for an answer that never comes.
            loop.call(lambda: setattr(proxy, "watch", silence_at_outcome(proxy, outcome_held)))
            assert outcome_held.wait(WAIT), ("no outcome statement", run.workers.tail(0, 40))
            signalled = time.monotonic()
            run.workers.signal(0, signal.SIGTERM)
            code, took = wait_for_exit(run, signalled, signalled + WAIT)
            stopped_log = run.workers.logs_of(0)
            # A blackhole loses what was held: the server sees the connections end and rolls
            # back the batch.
            loop.call(lambda: setattr(proxy, "watch", None))
            loop.call(proxy.reset)
            loop.call(proxy.resume)
            run.injected()
            run.workers.replace(0)  # the next owner
            deadline = time.monotonic() + WAIT
            while live_members(run.store) < WORKERS:
                run.workers.assert_running()
                assert time.monotonic() < deadline, "the new worker did not join"
                time.sleep(0.1)
            hold(run, FLOWING)
            run.finish()
    finally:
        if report.rows:
            RESULTS.append(report)
    print(f"{report.scenario}: exit {code} {took:.2f} s after SIGTERM")
    assert code == 0, (code, stopped_log[-4000:])
    assert took <= STOP_BOUND, (took, stopped_log[-4000:])
    found = [marker for marker in UNCAUGHT if marker in stopped_log]
    assert not found, (found, stopped_log[-5000:])
    assert not report.problems(), report.problems()


def silence_at_outcome(proxy: Proxy, held: threading.Event) -> Watch:
    async def watch(link: Link, message: ClientMessage) -> Verdict:
        if message.outcome and not held.is_set():
            proxy.stall()  # this message and everything after it are held
            held.set()
        return FORWARD

    return watch


def wait_for_exit(run: Run, signalled: float, until: float) -> tuple[int | None, float]:
    """The worker's exit status and the seconds from ``signalled`` to its exit (None and
    infinity: still running at ``until``, then killed)."""
    process = run.workers.processes[0]
    while time.monotonic() < until:
        if (code := process.poll()) is not None:
            return code, time.monotonic() - signalled
        time.sleep(0.02)
    process.kill()
    process.wait()
    return None, float("inf")
