"""Fixtures of the chaos suite, and the table of results at the end of the session.

A scenario that takes the ``storage`` fixture runs once in each storage mode it applies to
(docs/storage.md) that ``--storage`` selects (``delete``, ``partitioned`` or ``both``, the
default; ``make chaos STORAGE=...``): a ``chaos`` scenario in both modes, any other (a smoke
that ``make test`` runs) in delete mode only unless marked ``storages("delete",
"partitioned")``. A scenario that cannot apply in a mode says so with
``storage_skip("partitioned", reason)``: that mode's run is skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from relayer.embedded import EmbeddedPostgres
from relayer.settings.stores import STORAGE_MODES
from tests.chaos.brokers import (
    KafkaTarget,
    NatsTarget,
    RabbitTarget,
    RedisTarget,
    SQSTarget,
    WebhookTarget,
)
from tests.chaos.checker import RESULTS, table
from tests.chaos.proxy import LoopThread
from tests.conftest import start_pgbouncer, with_database
from tests.pgbouncer import PgBouncer


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "storage" not in metafunc.fixturenames:
        return
    chosen = metafunc.config.getoption("storage")
    declared = metafunc.definition.get_closest_marker("storages")
    if declared is not None:
        modes = tuple(declared.args)
    elif metafunc.definition.get_closest_marker("chaos") is not None:
        modes = STORAGE_MODES
    else:
        modes = ("delete",)
    skips = {
        marker.args[0]: pytest.mark.skip(reason=f"{marker.args[0]} storage: {marker.args[1]}")
        for marker in metafunc.definition.iter_markers("storage_skip")
    }
    metafunc.parametrize(
        "storage",
        [
            pytest.param(mode, marks=[skips[mode]] if mode in skips else [])
            for mode in modes
            if chosen in ("both", mode)
        ],
    )


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    try:
        yield thread
    finally:
        thread.close()


@pytest.fixture
def kafka(loop: LoopThread) -> Iterator[KafkaTarget]:
    target = KafkaTarget(loop)
    try:
        yield target
    finally:
        target.close()


@pytest.fixture
def rabbitmq(loop: LoopThread, rabbitmq_url: str) -> Iterator[RabbitTarget]:
    target = RabbitTarget(loop, rabbitmq_url, proxied=True)
    try:
        yield target
    finally:
        target.close()


@pytest.fixture
def nats_target(loop: LoopThread, nats_url: str) -> Iterator[NatsTarget]:
    target = NatsTarget(loop, nats_url)
    try:
        yield target
    finally:
        target.close()


@pytest.fixture
def redis_target(loop: LoopThread, redis_url: str) -> Iterator[RedisTarget]:
    target = RedisTarget(loop, redis_url)
    try:
        yield target
    finally:
        target.close()


@pytest.fixture
def webhooks(loop: LoopThread) -> Iterator[WebhookTarget]:
    target = WebhookTarget(loop)
    try:
        yield target
    finally:
        target.close()


@pytest.fixture
def sqs(loop: LoopThread, sqs_endpoint: str) -> Iterator[SQSTarget]:
    target = SQSTarget(loop, sqs_endpoint)
    try:
        yield target
    finally:
        target.close()


@pytest.fixture
def own_postgres() -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A durable PostgreSQL server of the test's own (it gets restarted) and a database DSN."""
    server = EmbeddedPostgres(durable=True).start()
    try:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE chaos")
        yield server, with_database(server.dsn, "chaos")
    finally:
        server.stop()


@pytest.fixture
def bouncer(pg_server: str) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode of the test's own (it gets restarted): 10 server
    connections per database for three workers and the writers."""
    started = start_pgbouncer(pg_server, pool_size=10)
    try:
        yield started
    finally:
        started.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if RESULTS:
        terminalreporter.section("chaos results")
        terminalreporter.write_line(table(RESULTS))
