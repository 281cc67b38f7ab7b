"""Chaos scenarios through PgBouncer in transaction mode: the workers (``pooler =
"transaction"``) and the writer reach PostgreSQL through it, the fault proxy sits between the
workers and PgBouncer. The invariants are the same as without it (tests/chaos/checker.py).

PgBouncer hands each transaction to any of its server connections, so a client that dies or
is cut off mid-transaction makes it close that server connection (its locks go with it); a
PgBouncer restart drops every client and server connection at once.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from relayer.settings.stores import Storage
from tests.chaos.brokers import KafkaTarget
from tests.chaos.harness import Run
from tests.chaos.proxy import LoopThread
from tests.chaos.test_chaos import (
    FULL,
    SMOKE,
    kill_before_delete,
    postgres_proxy_faults,
    relay,
    stop_past_lease,
    terminate_backends_all,
    until,
)
from tests.pgbouncer import PgBouncer


def restart_pgbouncer(bouncer: PgBouncer, times: int = 2) -> object:
    def restart(run: Run, seconds: float) -> None:
        for number in range(times):
            until(run, seconds * (number + 1) / (times + 1))
            bouncer.restart(signal.SIGKILL)  # a crash: every connection drops at once
            run.injected()

    return restart


@pytest.mark.chaos
def test_pgbouncer_kill_before_delete(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    bouncer: PgBouncer,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "PgBouncer: SIGKILL after send, before delete (x2)",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        kill_before_delete,
        FULL,
        bouncer=bouncer,
        storage=storage,
    )


@pytest.mark.chaos
def test_pgbouncer_restart(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    bouncer: PgBouncer,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "PgBouncer killed (SIGKILL) and restarted (x2)",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        restart_pgbouncer(bouncer),  # type: ignore[arg-type]
        FULL,
        bouncer=bouncer,
        storage=storage,
    )


@pytest.mark.chaos
def test_pgbouncer_proxy(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    bouncer: PgBouncer,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "PgBouncer: proxy to it, 50 ms latency, 2.4 s stall, resets",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        postgres_proxy_faults,
        FULL,
        bouncer=bouncer,
        storage=storage,
    )


@pytest.mark.chaos
def test_pgbouncer_stop_past_lease(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    bouncer: PgBouncer,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "PgBouncer: SIGSTOP mid-batch for 1.5 leases, SIGCONT",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        stop_past_lease,
        FULL,
        bouncer=bouncer,
        storage=storage,
    )


@pytest.mark.chaos
def test_pgbouncer_terminate_backends(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    bouncer: PgBouncer,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "PgBouncer: pg_terminate_backend of every relay server connection",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        terminate_backends_all,
        FULL,
        bouncer=bouncer,
        storage=storage,
    )


@pytest.mark.chaos_smoke
def test_smoke_pgbouncer_kill_and_restart(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    bouncer: PgBouncer,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    def faults(run: Run, seconds: float) -> None:
        kill_before_delete(run, seconds)  # once, at a sixth of the run
        until(run, seconds / 2)
        # Once the replacement serves: a worker that cannot connect while it starts exits
        # (a supervisor restarts it), which is not what this scenario is about.
        run.workers.wait_serving()
        bouncer.restart(signal.SIGKILL)
        run.injected()

    relay(
        request,
        "PgBouncer: SIGKILL after send, before delete; PgBouncer killed and restarted",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        faults,
        SMOKE,
        bouncer=bouncer,
    )
