"""``relayer run`` stays readable while a broker or the database is down: one line per cause
per interval, no traceback, no warning nobody can act on.

Each test runs the CLI as a subprocess against a real broker (the tansu Kafka broker, RabbitMQ)
or PostgreSQL behind a TCP proxy that then refuses every connection for 10 s, or a port where
nothing listens, with a writer adding rows all along, and counts the lines the worker printed.

The bound, at most 10 lines for those 10 s: the throttle's interval (30 s) is longer than the
fault, so each cause is logged once; a broker or database that is down produces a handful of
causes (the client's connection error, all brokers down, rows waiting for the transport, rolled
back batches, heartbeats, the LISTEN and dispatcher connections), each on one line. Before the
throttle the same 10 s printed 140 (PostgreSQL), 196 (Kafka refused), about 600 (Kafka
restarted) and 391 (unreachable bootstrap) lines, and RabbitMQ a 25-line traceback.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from relayer import Outbox, OutboxMessage
from relayer.embedded import EmbeddedKafka, free_port
from relayer.settings import StoreSettings
from tests.acceptance.cli import command, environment
from tests.chaos.brokers import kafka_topic_behind_proxy
from tests.chaos.proxy import LoopThread, Proxy
from tests.contract.brokers import create_topics, unique

FAULT_SECONDS = 10.0
MOST_LINES = 10


class Run:
    """``relayer --config PATH run orders`` with its stderr lines, each with when it came."""

    def __init__(self, config: Path) -> None:
        self.lines: list[tuple[float, str]] = []
        self.process = subprocess.Popen(
            command("--config", str(config), "run", "orders"),
            env=environment(),
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def between(self, start: float, end: float) -> list[str]:
        return [line for at, line in self.lines if start <= at < end]

    def wait_for(self, fragment: str, within: float = 60) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if any(fragment in line for _, line in self.lines):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{fragment!r} never logged:\n{self.text()}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(10)
        return self.process.returncode


def fault_window(run: Run, start: Callable[[], None], end: Callable[[], None]) -> list[str]:
    """The lines the worker printed while the fault lasted."""
    run.wait_for("[action=start ")
    time.sleep(2)  # relaying normally
    began = time.monotonic()
    start()
    time.sleep(FAULT_SECONDS)
    ended = time.monotonic()
    end()
    return run.between(began, ended)


def assert_quiet(lines: list[str], run: Run) -> None:
    assert len(lines) <= MOST_LINES, "\n".join(lines)
    assert not any("Traceback" in line or line.startswith(" ") for line in lines), run.text()
    assert not any("experimental" in line for _, line in run.lines), run.text()


@pytest.fixture
def writing(store: StoreSettings) -> Iterator[Callable[[str], None]]:
    """Starts a writer of keyed rows to a destination (one transaction of 20 rows each 50 ms)."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def write(destination: str) -> None:
        outbox = Outbox(store)
        with psycopg.connect(store.require_dsn()) as conn:
            number = 0
            while not stop.is_set():
                messages = [
                    OutboxMessage(destination, b"x", key=f"key-{(number + n) % 100}")
                    for n in range(20)
                ]
                outbox.write_many(conn, messages)
                conn.commit()
                number += 20
                stop.wait(0.05)

    def start(destination: str) -> None:
        thread = threading.Thread(target=write, args=(destination,), daemon=True)
        thread.start()
        threads.append(thread)

    yield start
    stop.set()
    for thread in threads:
        thread.join(10)


def config_file(tmp_path: Path, dsn: str, transport: str) -> Path:
    path = tmp_path / "relayer.toml"
    path.write_text(
        f"""
[stores.orders]
dsn = "{dsn}"
table_prefix = "orders_"
lanes = 16
lease_duration = "6s"
poll_interval = "0.5s"
retry_backoff = "0.5s"
default_transport = "broker"

[stores.orders.transports.broker]
{transport}
""",
        "utf-8",
    )
    return path


def kafka_toml(bootstrap: str) -> str:
    return f'type = "kafka"\n"bootstrap.servers" = "{bootstrap}"\nclose_timeout = 3\n'


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture
def kafka_behind_proxy(loop: LoopThread) -> Iterator[tuple[Proxy, EmbeddedKafka, str, str]]:
    """A tansu broker of this test's own, advertised through a proxy; (proxy, broker,
    bootstrap, topic)."""
    with kafka_topic_behind_proxy(loop, "floods", partitions=4) as running:
        yield running


def test_an_unreachable_bootstrap_server_prints_a_few_lines_before_its_error(
    store: StoreSettings, tmp_path: Path
) -> None:
    config = config_file(tmp_path, store.require_dsn(), kafka_toml(f"127.0.0.1:{free_port()}"))
    run = Run(config)  # metadata_timeout: 10 s of reconnecting before the start-up fails
    assert run.process.wait(60) == 1
    run.stop()
    lines = [line for _, line in run.lines]
    assert lines[-1].startswith("relayer: stores.orders.transports.broker cannot reach the "), lines
    assert len(lines) <= 6, "\n".join(lines)
    warnings = [line for line in lines if " WARNING " in line]
    assert warnings and all(": stores.orders.transports.broker: " in line for line in warnings)
    assert all("check bootstrap.servers" in line for line in warnings)
    assert not any("experimental" in line for line in lines)


def test_a_kafka_broker_refusing_connections_is_a_few_lines(
    store: StoreSettings,
    tmp_path: Path,
    loop: LoopThread,
    kafka_behind_proxy: tuple[Proxy, EmbeddedKafka, str, str],
    writing: Callable[[str], None],
) -> None:
    proxy, _, bootstrap, topic = kafka_behind_proxy
    writing(topic)
    run = Run(config_file(tmp_path, store.require_dsn(), kafka_toml(bootstrap)))
    try:
        lines = fault_window(
            run,
            lambda: loop.call(lambda: proxy.block(lambda hello: True)),
            lambda: loop.call(proxy.unblock),
        )
    finally:
        assert run.stop() == 0, run.text()
    assert_quiet(lines, run)
    assert any("stores.orders.transports.broker" in line for line in lines), run.text()


def test_a_restarted_kafka_broker_is_a_few_lines(
    store: StoreSettings,
    tmp_path: Path,
    loop: LoopThread,
    kafka_behind_proxy: tuple[Proxy, EmbeddedKafka, str, str],
    writing: Callable[[str], None],
) -> None:
    """The restarted broker has lost its topics and knows nothing of the producer: the worker
    rebuilds its producer (once, not on every poll)."""
    proxy, broker, bootstrap, topic = kafka_behind_proxy
    writing(topic)
    run = Run(config_file(tmp_path, store.require_dsn(), kafka_toml(bootstrap)))

    def restart() -> None:
        broker.restart()
        loop.call(lambda: setattr(proxy, "upstream", ("127.0.0.1", broker.port)))
        create_topics(bootstrap, [topic], partitions=4)

    try:
        lines = fault_window(run, restart, lambda: None)
    finally:
        assert run.stop() == 0, run.text()
    assert_quiet(lines, run)


def test_rabbitmq_refusing_connections_is_a_few_clear_lines_without_traceback(
    store: StoreSettings,
    tmp_path: Path,
    loop: LoopThread,
    rabbitmq_url: str,
    writing: Callable[[str], None],
) -> None:
    import aio_pika

    queue = unique("floods")

    async def declare(delete: bool = False) -> None:
        connection = await aio_pika.connect(rabbitmq_url)
        async with connection:
            channel = await connection.channel()
            if delete:
                await channel.queue_delete(queue)
            else:
                await channel.declare_queue(queue, durable=True)

    asyncio.run(declare())
    proxy = loop.call(lambda: Proxy(("127.0.0.1", 5672)))
    port = loop.run(proxy.listen())
    url = rabbitmq_url.replace("127.0.0.1:5672", f"127.0.0.1:{port}")
    transport = f'type = "rabbitmq"\nurl = "{url}"\nreconnect_interval = 0.2\n'
    writing("/" + queue)
    run = Run(config_file(tmp_path, store.require_dsn(), transport))
    try:
        lines = fault_window(
            run,
            lambda: loop.call(lambda: proxy.block(lambda hello: True)),
            lambda: loop.call(proxy.unblock),
        )
    finally:
        assert run.stop() == 0, run.text()
        loop.run(proxy.close())
        asyncio.run(declare(delete=True))
    assert_quiet(lines, run)
    # One line per cause (the transport's connection lost, the connection lost under the
    # confirms, then each reconnect refused), not one per lane scan.
    unavailable = [line for line in lines if "action=transport_unavailable" in line]
    assert 1 <= len(unavailable) <= 4, run.text()
    assert all(
        "rows wait for a broker that cannot be used now" in line or "lost its connection" in line
        for line in unavailable
    )


@pytest.fixture
def rabbitmq_queue(rabbitmq_url: str) -> Iterator[str]:
    """A durable queue of this test's own (deleted after)."""
    import aio_pika

    queue = unique("floods")

    async def declare(delete: bool = False) -> None:
        connection = await aio_pika.connect(rabbitmq_url)
        async with connection:
            channel = await connection.channel()
            if delete:
                await channel.queue_delete(queue)
            else:
                await channel.declare_queue(queue, durable=True)

    asyncio.run(declare())
    yield queue
    asyncio.run(declare(delete=True))


def test_a_rabbitmq_connection_reset_is_a_transport_unavailable_line(
    store: StoreSettings,
    tmp_path: Path,
    loop: LoopThread,
    rabbitmq_url: str,
    rabbitmq_queue: str,
) -> None:
    """A connection reset while nothing is being published (so no row fails on it) is still
    reported, as the documented ``transport_unavailable`` line that says what to do, once."""
    proxy = loop.call(lambda: Proxy(("127.0.0.1", 5672)))
    port = loop.run(proxy.listen())
    url = rabbitmq_url.replace("127.0.0.1:5672", f"127.0.0.1:{port}")
    transport = f'type = "rabbitmq"\nurl = "{url}"\nreconnect_interval = 0.2\n'
    run = Run(config_file(tmp_path, store.require_dsn(), transport))
    try:
        run.wait_for("[action=start ")
        assert loop.call(proxy.reset) == 1
        run.wait_for("action=transport_unavailable")
    finally:
        assert run.stop() == 0, run.text()
        loop.run(proxy.close())
    [line] = [line for _, line in run.lines if "action=transport_unavailable" in line]
    assert "lost its connection" in line and "check the broker" in line, line
    assert line.count("no attempt is counted") == 1, line
    assert not any("Traceback" in line for _, line in run.lines), run.text()


def test_postgresql_refusing_connections_is_a_few_lines(
    store: StoreSettings,
    tmp_path: Path,
    loop: LoopThread,
    kafka_behind_proxy: tuple[Proxy, EmbeddedKafka, str, str],
    writing: Callable[[str], None],
) -> None:
    _, _, bootstrap, topic = kafka_behind_proxy
    dsn = store.require_dsn()
    host = dsn.split("@", 1)[1].split("/", 1)[0]
    address, _, server_port = host.rpartition(":")
    proxy = loop.call(lambda: Proxy((address, int(server_port))))
    port = loop.run(proxy.listen())
    writing(topic)
    run = Run(config_file(tmp_path, dsn.replace(host, f"127.0.0.1:{port}"), kafka_toml(bootstrap)))
    try:
        lines = fault_window(
            run,
            lambda: loop.call(lambda: proxy.block(lambda hello: True)),
            lambda: loop.call(proxy.unblock),
        )
    finally:
        assert run.stop() == 0, run.text()
        loop.run(proxy.close())
    assert_quiet(lines, run)
    assert any("action=rollback" in line or "heartbeat" in line for line in lines), run.text()
