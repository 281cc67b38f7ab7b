"""Fault injectors of the chaos suite.

Faults that must hit an exact point of the protocol are driven by the PostgreSQL proxy
(tests/chaos/proxy.py), which sees every statement a worker sends, without any hook in
relayer's code:

- *SIGKILL after a send and before its delete*: the relay runs its outcome statement (the
  fenced delete) only after the broker acknowledged the batch's rows. The proxy holds that
  statement, SIGKILLs the worker that sent it and drops it: the broker has the rows, the outbox
  still has them, and the successor sends them again (at most batch_size duplicates a lane).
- *SIGKILL during commit*: the proxy forwards the COMMIT that follows an outcome statement and
  SIGKILLs the worker as soon as the bytes are written, before any reply can reach it.
- *SIGSTOP past the lease*: at an outcome statement, the worker is stopped for 1.5 leases
  with its lane batch open (its transaction keeps the lane row locked), then continued, and
  the held statement is forwarded.
- *pg_terminate_backend at the outcome*: the backend of the connection that sends the outcome
  statement is terminated (the proxy learnt its pid from BackendKeyData) before the
  statement is forwarded.

A plug-in transport that kills its own process after N acknowledgements would hit the first
point too, but it would have to be installed into the environment (an entry point) and could
not reach the commit; the proxy needs neither.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import psycopg

from tests.chaos.harness import Run
from tests.chaos.proxy import DROP, FORWARD, ClientMessage, Link, Verdict

Act = Callable[[Link], Awaitable[Verdict]]


@dataclass(eq=False, slots=True)
class Trigger:
    """Fires once, at the first matching message from the worker on ``slot``."""

    slot: int
    point: str  # "outcome" or "commit"
    act: Act
    fired: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout: float = 30) -> None:
        assert self.fired.wait(timeout), f"no {self.point} statement of worker {self.slot}"


class StatementFaults:
    """The PostgreSQL proxy's watch: runs armed triggers at outcome statements and commits."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.armed: list[Trigger] = []
        run.pg_proxy.watch = self.watch

    def arm(self, slot: int, point: str, act: Act) -> Trigger:
        trigger = Trigger(slot, point, act)
        self.run.loop.call(lambda: self.armed.append(trigger))
        return trigger

    async def watch(self, link: Link, message: ClientMessage) -> Verdict:
        for trigger in self.armed:
            if trigger.slot != link.tag:
                continue
            if (trigger.point == "outcome" and message.outcome) or (
                trigger.point == "commit" and message.commit_after_outcome
            ):
                self.armed.remove(trigger)
                verdict = await trigger.act(link)
                trigger.fired.set()
                return verdict
        return FORWARD

    # -- the faults ----------------------------------------------------------------------

    def kill_before_delete(self, slot: int) -> Trigger:
        async def act(link: Link) -> Verdict:
            self.run.workers.signal(slot, signal.SIGKILL)
            return DROP

        return self.arm(slot, "outcome", act)

    def kill_during_commit(self, slot: int) -> Trigger:
        async def act(link: Link) -> Verdict:
            return Verdict(then=lambda: self.run.workers.signal(slot, signal.SIGKILL))

        return self.arm(slot, "commit", act)

    def stop_past_lease(self, slot: int, seconds: float) -> Trigger:
        async def act(link: Link) -> Verdict:
            self.run.workers.signal(slot, signal.SIGSTOP)
            await asyncio.sleep(seconds)
            self.run.workers.signal(slot, signal.SIGCONT)
            return FORWARD

        return self.arm(slot, "outcome", act)

    def terminate_at_outcome(self, slot: int) -> Trigger:
        async def act(link: Link) -> Verdict:
            pid = link.postgres.backend_pid
            assert pid is not None
            await asyncio.to_thread(terminate, self.run.store.require_dsn(), [pid])
            await asyncio.sleep(0.05)  # let the server close the session first
            return FORWARD

        return self.arm(slot, "outcome", act)


def terminate(dsn: str, pids: list[int] | None = None) -> int:
    """pg_terminate_backend of the given backends, or of every relay connection (application
    names ``relayer:...``) to this database; returns how many were terminated."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if pids is None:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE 'relayer:%%' "
                "AND pid <> pg_backend_pid()"
            ).fetchone()
        else:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                "FROM unnest(%s::int[]) AS pid",
                (pids,),
            ).fetchone()
    assert row is not None
    return int(row[0])


def faketime_library() -> str | None:
    """libfaketime's preload library (Debian: apt-get install libfaketime), or None."""
    for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib"):
        path = os.path.join(folder, "faketime", "libfaketime.so.1")
        if os.path.exists(path):
            return path
    return None
