"""Silent broker stalls (issue 13, items 1 and 2): the proxy in front of the broker forwards
nothing while every TCP connection stays open, so no confirm, no delivery report and no error
arrives. A stalled broker is a broker that cannot be reached: no attempt is counted against any
row, no key is parked (let alone left waiting for an operator), the lanes are retried once the
broker answers again, and everything drains with nothing lost. SIGTERM during such a stall
stops a worker within ``lease_duration / 2`` + 1 s, with exit status 0 and no uncaught
exception, leaving the unacknowledged rows to the next owner.

``make chaos`` runs the 45 s stalls of the issue (marker ``chaos``, in both storage modes);
``make test`` runs
shorter ones (several leases long and past ``retry_backoff_max``) and the SIGTERM scenario,
on Kafka and RabbitMQ, and on NATS JetStream, Redis Streams, webhooks and SQS (moto) too.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from relayer.settings.stores import Storage
from tests.chaos.audit import Counted, read_counted
from tests.chaos.brokers import (
    KafkaTarget,
    NatsTarget,
    RabbitTarget,
    RedisTarget,
    SQSTarget,
    WebhookTarget,
)
from tests.chaos.checker import RESULTS, Report
from tests.chaos.harness import (
    Run,
    Settings,
    Target,
    live_members,
    running,
)
from tests.chaos.proxy import LoopThread, Proxy

# The settings of the run: lease 6 s, backoff 0.5 s up to 5 s, 10 attempts, 1,000 keys.
SETTINGS = Settings(
    lease=6.0, retry_backoff=0.5, retry_backoff_max=5.0, max_attempts=10, keys=1_000
)
WORKERS = 2
LONG_STALL = 45.0
SHORT_STALL = 13.0  # over two leases, and over retry_backoff_max twice
FLOWING = 3.0  # seconds of writing before and after the stall
# The acceptance bound: fewer log lines than this per worker for the whole stall.
LOG_LINES = 100
# SIGTERM this long into the stall; the stall lasts well past the stop bound.
SIGTERM_AFTER = 2.0
SIGTERM_STALL = 8.0
# Webhooks cost a request a row (about 3 ms of httpx's CPU on the project's machine, and the
# receiver's in the test process): written at the usual rate, the backlog of a stall would
# outgrow what two workers can post before the run's drain deadline.
HTTP_SETTINGS = dataclasses.replace(SETTINGS, rows_per_second=60)
STOP_BOUND = SETTINGS.lease / 2 + 1
UNCAUGHT = ("Traceback", "Exception in thread", "never retrieved")
STALL_SAID = re.compile(r"action=transport_stall\b")


@dataclass(slots=True)
class StallReport:
    """What a stall run measured besides the invariants."""

    counted: Counted
    lines_in_stall: list[int]  # per worker: log lines from the stall's start to its end
    lines_from_stall: list[int]  # per worker: from the stall's start to the worker's exit
    said: list[bool]  # per worker: whether it logged the stall (action=transport_stall)

    def summary(self) -> str:
        return (
            f"parked keys {self.counted.parked_keys} (waiting for an operator: "
            f"{self.counted.operator_keys}), rows with attempts {self.counted.attempted_rows} "
            f"(most {self.counted.most_attempts}), log lines per worker in the stall "
            f"{self.lines_in_stall}, from the stall to the exit {self.lines_from_stall}, "
            f"said the stall {self.said}; "
            f"park errors: {list(self.counted.errors)}"
        )


Stalled = KafkaTarget | RabbitTarget | NatsTarget | RedisTarget | WebhookTarget | SQSTarget


def proxy_of(target: Stalled) -> Proxy:
    assert target.proxy is not None
    return target.proxy


def line_counts(run: Run) -> list[int]:
    return [len(run.workers.logs_of(slot).splitlines()) for slot in range(WORKERS)]


def lines_since(run: Run, counts: list[int]) -> list[list[str]]:
    """Per worker, the log lines after the first ``counts[slot]``."""
    return [run.workers.logs_of(slot).splitlines()[counts[slot] :] for slot in range(WORKERS)]


def hold(run: Run, seconds: float) -> None:
    """Wait ``seconds``, failing at once if a worker exited."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        run.workers.assert_running()
        time.sleep(min(left, 0.2))


def new_report(request: pytest.FixtureRequest, fault: str, target: Target) -> Report:
    name = request.node.name
    report = Report(name, fault, target.name, WORKERS, SETTINGS.batch_size, injections=1)
    marker = "chaos" if request.node.get_closest_marker("chaos") else "not chaos"
    report.command = f"pytest -m '{marker}' tests/chaos/test_stall.py -k {name}"
    return report


def stalled(
    request: pytest.FixtureRequest,
    target: Stalled,
    dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    seconds: float,
    settings: Settings = SETTINGS,
    storage: Storage = "delete",
) -> StallReport:
    """Write, stall the broker for ``seconds`` while writing on, resume, drain, check (on a
    store of ``storage`` mode)."""
    proxy = proxy_of(target)
    report = new_report(request, f"silent broker stall, {seconds:g} s", target)
    run = Run(report, dsn, tmp_path, loop, target, settings, storage=storage)
    try:
        with running(run):
            hold(run, FLOWING)
            before = line_counts(run)
            loop.call(proxy.stall)
            try:
                hold(run, seconds)
            finally:
                loop.call(proxy.resume)
            during = lines_since(run, before)
            run.injected()
            hold(run, FLOWING)
            run.finish()
            after = lines_since(run, before)
    finally:
        if report.rows:
            RESULTS.append(report)
    stall = StallReport(
        read_counted(run.store),
        [len(lines) for lines in during],
        [len(lines) for lines in after],
        [STALL_SAID.search("\n".join(lines)) is not None for lines in during],
    )
    print(f"{report.scenario}: {stall.summary()}")
    assert not report.problems(), (report.problems(), stall.summary())
    assert stall.counted.parked_keys == 0, stall.summary()
    assert stall.counted.attempted_rows == 0, stall.summary()
    assert max(stall.lines_from_stall) < LOG_LINES, (stall.summary(), run.workers.tail(0, 60))
    assert all(stall.said), ("a worker did not log the stall", stall.summary())
    return stall


def sigterm_in_stall(
    request: pytest.FixtureRequest,
    target: Stalled,
    dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    settings: Settings = SETTINGS,
) -> list[float]:
    """SIGTERM every worker ``SIGTERM_AFTER`` into a stall; each must exit 0 within the stop
    bound without an uncaught exception. Then the broker answers, new workers take over the
    lanes and drain what the stopped ones left (nothing lost)."""
    proxy = proxy_of(target)
    report = new_report(request, f"SIGTERM {SIGTERM_AFTER:g} s into a broker stall", target)
    run = Run(report, dsn, tmp_path, loop, target, settings)
    exits: list[float] = []
    codes: list[int | None] = []
    try:
        with running(run):
            hold(run, FLOWING)
            loop.call(proxy.stall)
            stalled_at = time.monotonic()
            try:
                hold(run, SIGTERM_AFTER)
                signalled = time.monotonic()
                for slot in range(WORKERS):
                    run.workers.signal(slot, signal.SIGTERM)
                exits, codes = wait_for_exits(run, signalled, stalled_at + SIGTERM_STALL)
                # The stall goes on past the bound whatever the workers did.
                time.sleep(max(stalled_at + SIGTERM_STALL - time.monotonic(), 0))
            finally:
                loop.call(proxy.resume)
            stopped_logs = [run.workers.logs_of(slot) for slot in range(WORKERS)]
            run.injected()
            for slot in range(WORKERS):
                run.workers.replace(slot)  # the next owners
            joined(run)
            hold(run, FLOWING)
            run.finish()
    finally:
        if report.rows:
            RESULTS.append(report)
    print(f"{report.scenario}: exits after SIGTERM {[f'{t:.2f}' for t in exits]} s, {codes}")
    assert codes == [0] * WORKERS, (codes, [log[-3000:] for log in stopped_logs])
    assert max(exits) <= STOP_BOUND, (exits, [log[-3000:] for log in stopped_logs])
    for log in stopped_logs:
        found = [marker for marker in UNCAUGHT if marker in log]
        assert not found, (found, log[-5000:])
    assert not report.problems(), report.problems()
    return exits


def joined(run: Run) -> None:
    """Wait until every worker process is a live member of the store."""
    deadline = time.monotonic() + 30
    while live_members(run.store) < WORKERS:
        run.workers.assert_running()
        assert time.monotonic() < deadline, "the new workers did not join within 30 s"
        time.sleep(0.1)


def wait_for_exits(
    run: Run, signalled: float, until: float
) -> tuple[list[float], list[int | None]]:
    """Seconds from ``signalled`` to each worker's exit, and its status (None: still running
    at ``until``, then killed)."""
    exits: list[float] = [float("inf")] * WORKERS
    codes: list[int | None] = [None] * WORKERS
    while time.monotonic() < until and None in codes:
        for slot, process in enumerate(run.workers.processes):
            if codes[slot] is None and (code := process.poll()) is not None:
                codes[slot] = code
                exits[slot] = time.monotonic() - signalled
        time.sleep(0.02)
    for slot, process in enumerate(run.workers.processes):
        if codes[slot] is None:
            process.kill()
            process.wait()
    return exits, codes


# -- RabbitMQ ------------------------------------------------------------------------------


@pytest.mark.chaos
def test_rabbitmq_long_stall(
    request: pytest.FixtureRequest,
    rabbitmq: RabbitTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    stalled(request, rabbitmq, pg_dsn, tmp_path, loop, LONG_STALL, storage=storage)


def test_rabbitmq_stall(
    request: pytest.FixtureRequest,
    rabbitmq: RabbitTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    stalled(request, rabbitmq, pg_dsn, tmp_path, loop, SHORT_STALL)


def test_rabbitmq_sigterm_in_stall(
    request: pytest.FixtureRequest,
    rabbitmq: RabbitTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    sigterm_in_stall(request, rabbitmq, pg_dsn, tmp_path, loop)


# -- Kafka ---------------------------------------------------------------------------------


@pytest.fixture
def kafka_default_close(kafka: KafkaTarget) -> KafkaTarget:
    """The Kafka target with the transport's own close_timeout (30 s), as users run it."""
    kafka.close_timeout = None
    return kafka


@pytest.mark.chaos
def test_kafka_long_stall(
    request: pytest.FixtureRequest,
    kafka_default_close: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
    storage: Storage,
) -> None:
    stalled(request, kafka_default_close, pg_dsn, tmp_path, loop, LONG_STALL, storage=storage)


def test_kafka_stall(
    request: pytest.FixtureRequest,
    kafka_default_close: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    stalled(request, kafka_default_close, pg_dsn, tmp_path, loop, SHORT_STALL)


def test_kafka_sigterm_in_stall(
    request: pytest.FixtureRequest,
    kafka_default_close: KafkaTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    sigterm_in_stall(request, kafka_default_close, pg_dsn, tmp_path, loop)


# -- NATS JetStream and Redis Streams -------------------------------------------------------


def test_nats_stall(
    request: pytest.FixtureRequest,
    nats_target: NatsTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    stalled(request, nats_target, pg_dsn, tmp_path, loop, SHORT_STALL)


def test_redis_stall(
    request: pytest.FixtureRequest,
    redis_target: RedisTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    stalled(request, redis_target, pg_dsn, tmp_path, loop, SHORT_STALL)


def test_nats_sigterm_in_stall(
    request: pytest.FixtureRequest,
    nats_target: NatsTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    sigterm_in_stall(request, nats_target, pg_dsn, tmp_path, loop)


def test_redis_sigterm_in_stall(
    request: pytest.FixtureRequest,
    redis_target: RedisTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    sigterm_in_stall(request, redis_target, pg_dsn, tmp_path, loop)


# -- webhooks and SQS ----------------------------------------------------------------------


def test_webhooks_stall(
    request: pytest.FixtureRequest,
    webhooks: WebhookTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    stalled(request, webhooks, pg_dsn, tmp_path, loop, SHORT_STALL, HTTP_SETTINGS)


def test_sqs_stall(
    request: pytest.FixtureRequest,
    sqs: SQSTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    stalled(request, sqs, pg_dsn, tmp_path, loop, SHORT_STALL)


def test_webhooks_sigterm_in_stall(
    request: pytest.FixtureRequest,
    webhooks: WebhookTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    sigterm_in_stall(request, webhooks, pg_dsn, tmp_path, loop, HTTP_SETTINGS)


def test_sqs_sigterm_in_stall(
    request: pytest.FixtureRequest,
    sqs: SQSTarget,
    pg_dsn: str,
    tmp_path: Path,
    loop: LoopThread,
) -> None:
    sigterm_in_stall(request, sqs, pg_dsn, tmp_path, loop)
