"""Shared fixtures: real PostgreSQL (a fresh database per test), Kafka, RabbitMQ, NATS and
Redis, and each of the two paths of relayer.store.wire."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from hypothesis import settings as hypothesis_settings
from psycopg import sql

from relayer.operations import schema
from relayer.settings import StoreSettings, store_settings
from relayer.store import wire
from tests.pgbouncer import PgBouncer, find_pgbouncer
from tests.services import (
    DEFAULT_NATS_URL,
    DEFAULT_REDIS_URL,
    find_loopback,
    find_rabbitmq,
    start_kafka,
    start_postgres,
    start_sqs,
    started,
    unavailable,
)

# Property tests never fail for being slow: hypothesis's default deadline (200 ms an example)
# fails them on a busy machine, and tests must not depend on timing.
hypothesis_settings.register_profile("relayer", deadline=None)
hypothesis_settings.load_profile("relayer")

_database_numbers = itertools.count()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--storage",
        choices=("delete", "partitioned", "both"),
        default="both",
        help="the storage modes the chaos scenarios run in (tests/chaos/conftest.py): each "
        "scenario runs in its modes that this selects (default: both)",
    )


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at another database on the same server."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        return urlunsplit(parts._replace(path="/" + database))
    return f"{dsn} dbname={database}"


def with_user(dsn: str, user: str) -> str:
    """``dsn`` connecting as ``user`` (without a password: the test servers trust loopback)."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        return urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}"))
    return f"{dsn} user={user}"


_LOGGERS = ("", "relayer", "aiormq", "psycopg")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The CLI, run in-process by some tests, replaces the root logger's handlers with one on
    sys.stderr (pytest's capture file, closed after the test): put back what was there, or a
    later test's log line fails to write ("I/O operation on closed file")."""
    saved = [
        (logger, list(logger.handlers), logger.level)
        for logger in (logging.getLogger(name) for name in _LOGGERS)
    ]
    yield
    for logger, handlers, level in saved:
        logger.handlers[:] = handlers
        logger.setLevel(level)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    with started(start_postgres, "PostgreSQL") as service:
        if isinstance(service, str):
            unavailable(service)
        else:
            yield service.address


@pytest.fixture(scope="session")
def pg_template(pg_server: str) -> Iterator[str]:
    """An empty template database; each test's database is a clone of it."""
    name = f"relayer_template_{os.getpid()}"
    try:
        admin = psycopg.connect(pg_server, autocommit=True)
    except psycopg.OperationalError as exc:
        unavailable(f"PostgreSQL is not reachable: {exc}")
    with admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(pg_server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextlib.contextmanager
def fresh_database(pg_server: str, pg_template: str, name: str) -> Iterator[str]:
    """The DSN of database ``name``, cloned from the template (dropped first if a crashed run
    left it), dropped at the end of the block."""
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(drop)
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(pg_template)
            )
        )
    try:
        yield with_database(pg_server, name)
    finally:
        with psycopg.connect(pg_server, autocommit=True) as admin:
            admin.execute(drop)


@pytest.fixture
def pg_dsn(pg_server: str, pg_template: str) -> Iterator[str]:
    """The DSN of a fresh database, cloned from the template, dropped after the test."""
    name = f"relayer_test_{os.getpid()}_{next(_database_numbers)}"
    with fresh_database(pg_server, pg_template, name) as dsn:
        yield dsn


def make_store(dsn: str, **overrides: Any) -> StoreSettings:
    values: dict[str, Any] = {"name": "orders", "dsn": dsn, "lanes": 16, "table_prefix": "orders_"}
    values.update(overrides)
    return store_settings(**values)


async def apply_schema(store: StoreSettings) -> None:
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        await schema.apply(conn, store)


@pytest.fixture
async def store(pg_dsn: str) -> AsyncIterator[StoreSettings]:
    """A store named 'orders' (16 lanes, prefix orders_) with its schema applied."""
    settings = make_store(pg_dsn)
    await apply_schema(settings)
    yield settings


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    with started(start_kafka, "Kafka") as service:
        if isinstance(service, str):
            unavailable(service)
        else:
            yield service.address


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    service = find_rabbitmq()
    if service is None:
        unavailable(
            "RabbitMQ is not available: set RELAYER_TEST_RABBITMQ_URL or run a server on "
            "127.0.0.1:5672"
        )
        return
    try:
        yield service.address
    finally:
        service.stop()


@pytest.fixture(scope="session")
def nats_url() -> str:
    """A NATS server with JetStream enabled."""
    service = find_loopback("RELAYER_TEST_NATS_URL", DEFAULT_NATS_URL)
    if service is None:
        unavailable(
            "NATS is not available: set RELAYER_TEST_NATS_URL or run nats-server -js on "
            "127.0.0.1:4222"
        )
    assert service is not None
    return service.address


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A Redis server (5.0 or later: streams)."""
    service = find_loopback("RELAYER_TEST_REDIS_URL", DEFAULT_REDIS_URL)
    if service is None:
        unavailable(
            "Redis is not available: set RELAYER_TEST_REDIS_URL or run redis-server on "
            "127.0.0.1:6379"
        )
    assert service is not None
    return service.address


@pytest.fixture(scope="session")
def sqs_endpoint() -> Iterator[str]:
    """moto's SQS server (tests/sqs_server.py): its URL; any credentials will do."""
    with started(start_sqs, "SQS (moto's server)") as service:
        if isinstance(service, str):
            unavailable(service)
        else:
            yield service.address


def start_pgbouncer(server: str, **options: Any) -> PgBouncer:
    """A started PgBouncer in front of ``server`` (tests/pgbouncer.py); skips or, under CI,
    fails the test when pgbouncer is not installed."""
    binary = find_pgbouncer()
    if binary is None:
        unavailable("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
    assert binary is not None
    return PgBouncer(binary, server, **options).start()


@pytest.fixture(scope="session")
def pgbouncer(pg_server: str) -> Iterator[PgBouncer]:
    """PgBouncer pooling by transaction, 8 server connections per database."""
    bouncer = start_pgbouncer(pg_server, pool_size=8)
    try:
        yield bouncer
    finally:
        bouncer.close()


@pytest.fixture(scope="session")
def pgbouncer_strict(pg_server: str) -> Iterator[PgBouncer]:
    """PgBouncer pooling by transaction over 2 server connections per database, running
    DISCARD ALL whenever one changes hands: any session state a client counts on is lost."""
    bouncer = start_pgbouncer(pg_server, pool_size=2, reset_always=True)
    try:
        yield bouncer
    finally:
        bouncer.close()


@pytest.fixture(params=["fast", "public"])
def wire_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> wire.WirePath:
    """The test runs twice, on each way relayer.store.wire goes to PostgreSQL: libpq's pipeline
    (the fast path, whatever psycopg is installed) and psycopg's cursors (the public path, as
    forced: without a warning)."""
    path = wire.WirePath(public=request.param == "public")
    monkeypatch.setattr(wire, "PROCESS_PATH", path)
    return path
