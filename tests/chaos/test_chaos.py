"""Chaos scenarios: three ``relayer run orders`` workers, two steady writers and one kind of
fault each; then the checker verifies I1-I5 (tests/chaos/checker.py) and the result goes into
the table printed at the end of the session (docs/chaos.md).

``make chaos`` runs every scenario (marker ``chaos``) in both storage modes (docs/storage.md;
``make chaos STORAGE=delete`` or ``STORAGE=partitioned`` runs one); ``make test`` runs the
short smoke versions (marker ``chaos_smoke``), in delete mode, of SIGKILL-before-delete (in
partitioned mode too) and pg_terminate_backend (and, in tests/chaos/test_pgbouncer.py, of
SIGKILL and a restart through PgBouncer), and the smokes of the HTTP transports (a stall and
resets through the proxy in front of their endpoint).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from relayer.embedded import EmbeddedPostgres
from relayer.settings.stores import Storage
from tests.chaos.brokers import KafkaTarget, RabbitTarget, SQSTarget, WebhookTarget
from tests.chaos.checker import RESULTS, Report
from tests.chaos.faults import StatementFaults, faketime_library, terminate
from tests.chaos.harness import Run, Settings, Target, running
from tests.chaos.proxy import LoopThread, Proxy
from tests.pgbouncer import PgBouncer

SETTINGS = Settings()
WORKERS = 3
FULL = 12.0  # seconds of writing in a full scenario
SMOKE = 5.0

Scenario = Callable[[Run, float], None]


def relay(
    request: pytest.FixtureRequest,
    fault: str,
    target: Target,
    dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    scenario: Scenario,
    seconds: float,
    *,
    prepare: Callable[[Run], None] = lambda run: None,
    extra_env: Callable[[int], dict[str, str]] = lambda slot: {},
    bouncer: PgBouncer | None = None,
    storage: Storage = "delete",
) -> Report:
    """Run ``scenario`` while the writer writes for ``seconds`` on a store of ``storage``
    mode, check, record, assert (through ``bouncer``, PgBouncer in transaction mode, when
    given)."""
    name = request.node.name
    report = Report(name, fault, target.name, WORKERS, SETTINGS.batch_size, injections=0)
    marker = "chaos_smoke" if request.node.get_closest_marker("chaos_smoke") else "chaos"
    report.command = f"pytest -m {marker} tests/chaos -k {name}"
    run = Run(
        report,
        dsn,
        tmp_path,
        loop,
        target,
        SETTINGS,
        extra_env=extra_env,
        bouncer=bouncer,
        storage=storage,
    )
    prepare(run)
    try:
        with running(run):
            scenario(run, seconds)
            until(run, seconds)
            run.finish()
    finally:
        if report.rows:
            RESULTS.append(report)
    assert not report.problems(), report.problems()
    return report


def until(run: Run, seconds: float) -> None:
    """Sleep until ``seconds`` after the writer started, checking the workers meanwhile."""
    while (left := run.started + seconds - time.monotonic()) > 0:
        time.sleep(min(left, 0.2))


def hold(run: Run, seconds: float) -> None:
    until(run, time.monotonic() - run.started + seconds)


# -- the scenarios -----------------------------------------------------------------------


def no_fault(run: Run, seconds: float) -> None:
    """Nothing happens: the baseline has no duplicates."""


def kill_before_delete(run: Run, seconds: float) -> None:
    faults = StatementFaults(run)
    for slot, at in ((0, seconds / 6), (1, seconds / 2))[: 1 if seconds <= SMOKE else 2]:
        until(run, at)
        faults.kill_before_delete(slot).wait()
        run.injected()
        run.workers.replace(slot)


def kill_during_commit(run: Run, seconds: float) -> None:
    faults = StatementFaults(run)
    for slot, at in ((0, seconds / 6), (1, seconds / 2)):
        until(run, at)
        faults.kill_during_commit(slot).wait()
        run.injected()
        run.workers.replace(slot)


def stop_past_lease(run: Run, seconds: float) -> None:
    faults = StatementFaults(run)
    until(run, seconds / 6)
    trigger = faults.stop_past_lease(0, SETTINGS.lease * 1.5)
    trigger.wait()
    run.injected()


def terminate_backends(run: Run, seconds: float) -> None:
    """At an outcome statement, then every relay connection of every worker at once."""
    faults = StatementFaults(run)
    until(run, seconds / 6)
    faults.terminate_at_outcome(0).wait()
    run.injected()
    until(run, seconds / 2)
    assert terminate(run.store.require_dsn()) > 0
    run.injected()


def terminate_backends_all(run: Run, seconds: float) -> None:
    """Every relay connection of every worker at once, twice (behind a pooler: its server
    connections, which carry the client's application name)."""
    for at in (seconds / 4, seconds * 2 / 3):
        until(run, at)
        assert terminate(run.store.require_dsn()) > 0
        run.injected()


def postgres_proxy_faults(run: Run, seconds: float) -> None:
    proxy_faults(run, run.pg_proxy, seconds)


def proxy_faults(run: Run, proxy: Proxy, seconds: float) -> None:
    """Latency (50 ms each way) for a while, a stall past the batch deadline, then resets."""
    until(run, seconds / 6)
    run.loop.call(lambda: setattr(proxy, "latency", 0.05))
    hold(run, 3)
    run.loop.call(lambda: setattr(proxy, "latency", 0.0))
    run.injected()
    until(run, seconds / 2)
    run.loop.call(proxy.stall)
    hold(run, SETTINGS.lease * 0.6)
    run.loop.call(proxy.resume)
    run.injected()
    until(run, seconds * 3 / 4)
    assert run.loop.call(proxy.reset) > 0
    run.injected()


# -- PostgreSQL and Kafka ------------------------------------------------------------------


@pytest.mark.chaos
def test_baseline(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(request, "none", kafka, pg_dsn, tmp_path, loop, no_fault, FULL, storage=storage)


@pytest.mark.chaos
def test_kill_before_delete(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "SIGKILL after send, before delete (x2)",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        kill_before_delete,
        FULL,
        storage=storage,
    )


@pytest.mark.chaos_smoke
@pytest.mark.storages("delete", "partitioned")
def test_smoke_kill_before_delete(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "SIGKILL after send, before delete",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        kill_before_delete,
        SMOKE,
        storage=storage,
    )


@pytest.mark.chaos
def test_kill_during_commit(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "SIGKILL during COMMIT (x2)",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        kill_during_commit,
        FULL,
        storage=storage,
    )


@pytest.mark.chaos
def test_stop_past_lease(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "SIGSTOP mid-batch for 1.5 leases, SIGCONT",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        stop_past_lease,
        FULL,
        storage=storage,
    )


@pytest.mark.chaos
def test_terminate_backends(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "pg_terminate_backend: at an outcome, then all relay connections",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        terminate_backends,
        FULL,
        storage=storage,
    )


@pytest.mark.chaos_smoke
def test_smoke_terminate_backends(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    relay(
        request,
        "pg_terminate_backend: at an outcome, then all relay connections",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        terminate_backends,
        SMOKE,
    )


@pytest.mark.chaos
def test_postgres_restart(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    own_postgres: tuple[EmbeddedPostgres, str],
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    server = own_postgres[0]

    def restart(run: Run, seconds: float) -> None:
        until(run, seconds / 3)
        server.restart("immediate")
        run.injected()

    relay(
        request,
        "PostgreSQL crash (pg_ctl -m immediate) and restart",
        kafka,
        own_postgres[1],
        tmp_path,
        loop,
        restart,
        FULL,
        storage=storage,
    )


@pytest.mark.chaos
def test_postgres_proxy(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "proxy to PostgreSQL: 50 ms latency, 2.4 s stall, resets",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        postgres_proxy_faults,
        FULL,
        storage=storage,
    )


@pytest.mark.chaos
def test_lost_notify(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    def lose_notifications(run: Run) -> None:
        run.pg_proxy.drop_notifications = True

    def dropped(run: Run, seconds: float) -> None:
        until(run, seconds / 2)
        assert run.pg_proxy.dropped_notifications > 0

    relay(
        request,
        "every NOTIFY lost (the proxy drops them)",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        dropped,
        FULL,
        prepare=lose_notifications,
        storage=storage,
    )


@pytest.mark.chaos
def test_kafka_broker_restart(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    target = kafka

    def restart(run: Run, seconds: float) -> None:
        until(run, seconds / 3)
        target.restart()
        run.injected()

    relay(
        request,
        "Kafka broker killed and restarted empty (topic recreated)",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        restart,
        FULL,
        storage=storage,
    )


@pytest.mark.chaos
def test_kafka_proxy(
    request: pytest.FixtureRequest,
    kafka: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    target = kafka

    def faults(run: Run, seconds: float) -> None:
        proxy_faults(run, target.proxy, seconds)

    relay(
        request,
        "proxy to Kafka: 50 ms latency, 2.4 s stall, resets",
        kafka,
        pg_dsn,
        tmp_path,
        loop,
        faults,
        FULL,
        storage=storage,
    )


# -- RabbitMQ ------------------------------------------------------------------------------


@pytest.mark.chaos
def test_rabbitmq_close_connections(
    request: pytest.FixtureRequest,
    rabbitmq: RabbitTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    target = rabbitmq

    def close(run: Run, seconds: float) -> None:
        for at in (seconds / 4, seconds * 2 / 3):
            until(run, at)
            target.close_connections()
            run.injected()

    relay(
        request,
        "rabbitmqctl close_all_connections (x2)",
        rabbitmq,
        pg_dsn,
        tmp_path,
        loop,
        close,
        FULL,
        storage=storage,
    )


@pytest.mark.chaos
def test_rabbitmq_proxy(
    request: pytest.FixtureRequest,
    rabbitmq: RabbitTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    target = rabbitmq

    def faults(run: Run, seconds: float) -> None:
        assert target.proxy is not None
        proxy_faults(run, target.proxy, seconds)

    relay(
        request,
        "proxy to RabbitMQ: 50 ms latency, 2.4 s stall, resets",
        rabbitmq,
        pg_dsn,
        tmp_path,
        loop,
        faults,
        FULL,
        storage=storage,
    )


@pytest.mark.chaos
def test_rabbitmq_kill_before_delete(
    request: pytest.FixtureRequest,
    rabbitmq: RabbitTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    relay(
        request,
        "SIGKILL after send, before delete (x2)",
        rabbitmq,
        pg_dsn,
        tmp_path,
        loop,
        kill_before_delete,
        FULL,
        storage=storage,
    )


def stall_and_resets(run: Run, proxy: Proxy, seconds: float) -> None:
    """A stall past the batch deadline, then resets of every connection."""
    until(run, seconds / 4)
    run.loop.call(proxy.stall)
    hold(run, SETTINGS.lease * 0.6)
    run.loop.call(proxy.resume)
    run.injected()
    until(run, seconds * 2 / 3)
    assert run.loop.call(proxy.reset) > 0
    run.injected()


# -- webhooks ------------------------------------------------------------------------------


@pytest.mark.chaos_smoke
def test_smoke_webhooks_proxy(
    request: pytest.FixtureRequest,
    webhooks: WebhookTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    target = webhooks

    def faults(run: Run, seconds: float) -> None:
        stall_and_resets(run, target.proxy, seconds)

    relay(
        request,
        "proxy to the webhook endpoint: 2.4 s stall, resets",
        webhooks,
        pg_dsn,
        tmp_path,
        loop,
        faults,
        SMOKE,
    )


# -- SQS -----------------------------------------------------------------------------------


@pytest.mark.chaos_smoke
def test_smoke_sqs_proxy(
    request: pytest.FixtureRequest,
    sqs: SQSTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    target = sqs

    def faults(run: Run, seconds: float) -> None:
        stall_and_resets(run, target.proxy, seconds)

    relay(
        request,
        "proxy to SQS (moto): 2.4 s stall, resets",
        sqs,
        pg_dsn,
        tmp_path,
        loop,
        faults,
        SMOKE,
    )


@pytest.mark.chaos
def test_clock_skew(
    request: pytest.FixtureRequest,
    rabbitmq: RabbitTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    # On RabbitMQ: librdkafka's timed waits hang or spin under libfaketime (its threads wait on
    # absolute times that the preload shifts), which would test libfaketime, not relayer.
    library = faketime_library()
    if library is None:
        pytest.skip("libfaketime is not installed (make chaos installs it with apt-get)")

    def skewed(slot: int) -> dict[str, str]:
        if slot != 0:
            return {}
        # Two hours behind, and its clocks (monotonic too) run at 0.6 of real time.
        return {"LD_PRELOAD": str(library), "FAKETIME": "-2h x0.6"}

    def skew(run: Run, seconds: float) -> None:
        run.injected()

    relay(
        request,
        "one worker's clocks -2 h and at 0.6x speed (libfaketime)",
        rabbitmq,
        pg_dsn,
        tmp_path,
        loop,
        skew,
        FULL,
        extra_env=skewed,
        storage=storage,
    )
