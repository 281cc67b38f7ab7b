"""Efficiency: CPU per message of every process on the data path, against the machine's limit.

    python bench/efficiency.py [--rows 100000] [--transport kafka,rabbitmq,memory] [--rounds 1]
                               [--no-steady] [--steady-seconds 30] [--steady-rate 1000]
                               [--lanes 65536]

Contenders, measured in one run against the same PostgreSQL and brokers:
- relay -> Kafka / RabbitMQ / memory: ``relayer --config FILE run STORE`` (the real CLI, default
  worker settings; the store has 64 lanes, the default batch size and notify on) started on an
  empty outbox; once it serves, N rows (200-byte bodies, 10,000 keys) are written in ONE
  transaction; CPU counters are read right before its COMMIT and again when the outbox is
  empty. msg/s = N / (empty - committed).
- bare confluent-kafka producer and bare RabbitMQ publisher (aio-pika, pipelined confirms), in
  a child process, the same messages from memory; the child measures its own CPU around the
  send loop only.
- the least PostgreSQL work: a child that, per lane and in one transaction, locks the lane's
  lease row, reads 500 rows head first, deletes them by an id array and commits; its own CPU
  and its backend's.
CPU is user + system time from /proc: per thread (schedstat, in ns) for the worker (the main
thread apart from the others), the worker's PostgreSQL backends (pg_stat_activity rows whose
application_name is relayer:STORE:..., the store's name being unique to the run) and the broker
(tansu's process, or RabbitMQ's beam.smp, which other users of a shared server pollute).
The physical limit per message is the floor (client + backend) + the bare producer + the
broker's CPU per message under the bare producer; relayer's fraction is limit / relayer total.

Steady mode (on by default, to Kafka if selected): a writer process commits one row per
transaction at --steady-rate rows/s for --steady-seconds; a worker relays them. Reported: all
CPU per message over the window after a warm-up (worker, its sessions, broker; the writer and
its sessions apart) and commit-to-ack p50/p99. --lanes 65536 adds a drain with that many lanes
and an idle worker owning them. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import sql

from bench.common import machine, postgres, scratch_schema, server_version
from bench.cpu import Meter, Window, find_processes
from bench.relay import applied, make_store, write_backlog
from relayer.settings import StoreSettings

ROOT = Path(__file__).resolve().parents[1]
CHILDREN = Path(__file__).resolve().parent / "efficiency_children.py"
TRANSPORTS = ("kafka", "rabbitmq", "memory")
DEFAULT_LANES = 64
WARM_UP = 5.0  # steady mode: seconds of writing before the measured window opens
ACK_SAMPLE = 4  # steady mode: one message in this many gets an acknowledgement time


@dataclass
class Row:
    """One line of the table: a contender's rate and CPU µs per message by process."""

    path: str
    rate: float
    main: float | None
    other: float | None = None
    backends: float | None = None
    broker: float | None = None
    other_names: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(part or 0.0 for part in (self.main, self.other, self.backends, self.broker))


def per_message(seconds: float, messages: int) -> float:
    return seconds * 1e6 / max(messages, 1)


def window_row(path: str, window: Window, messages: int, rate: float) -> Row:
    """A drain's figures from its meter window (groups worker, worker other, backends, broker)."""
    row = Row(
        path,
        rate,
        per_message(window.group("worker"), messages),
        per_message(window.group("worker other"), messages),
        per_message(window.group("backends"), messages) if window.has("backends") else None,
        per_message(window.group("broker"), messages) if window.has("broker") else None,
        {
            name: per_message(seconds, messages)
            for name, seconds in window.by_name("worker other").items()
        },
    )
    for group, count in window.vanished.items():
        row.notes.append(
            f"{count} {group} thread(s)/backend(s) exited mid-run (CPU to last sample)"
        )
    return row


# -- the environment of one run ----------------------------------------------------------------


@dataclass
class Environment:
    dsn: str
    arguments: argparse.Namespace
    bootstrap: str | None = None
    broker_pids: dict[str, list[int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def tansu_pids(bootstrap: str) -> list[int]:
    port = bootstrap.rsplit(":", 1)[-1]
    return find_processes("tansu", f"127.0.0.1:{port}")


def rabbitmq_pids() -> list[int]:
    return find_processes("beam.smp", "rabbit")


@contextlib.contextmanager
def kafka_broker(bootstrap: str | None) -> Iterator[str]:
    from bench.transport_bare import kafka_cluster

    with kafka_cluster(bootstrap) as address:
        yield address


@contextlib.asynccontextmanager
async def rabbitmq_queue(url: str) -> AsyncIterator[str]:
    import aio_pika

    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(f"bench-{uuid.uuid4().hex[:12]}", durable=True)
        try:
            yield queue.name
        finally:
            await queue.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()


def transport_options(environment: Environment, transport: str) -> dict[str, Any]:
    if transport == "kafka":
        return {"type": "kafka", "bootstrap.servers": environment.bootstrap}
    if transport == "rabbitmq":
        return {"type": "rabbitmq", "url": environment.arguments.rabbitmq_url}
    return {"type": "memory"}


@contextlib.asynccontextmanager
async def destination(environment: Environment, transport: str) -> AsyncIterator[str]:
    if transport == "kafka":
        from bench.transport_bare import create_topic

        assert environment.bootstrap is not None
        yield await asyncio.to_thread(create_topic, environment.bootstrap)
    elif transport == "rabbitmq":
        async with rabbitmq_queue(environment.arguments.rabbitmq_url) as queue:
            yield "/" + queue
    else:
        yield "events"


def write_config(store: StoreSettings, transport: dict[str, Any], folder: str) -> str:
    """The worker's TOML: the store and its transport only, every other setting its default."""
    lines = [
        f'[stores."{store.name}"]',
        f'dsn = "{store.require_dsn()}"',
        f'schema = "{store.db_schema}"',
        f'table_prefix = "{store.table_prefix}"',
        f"lanes = {store.lanes}",
        "notify = true",
        'default_transport = "broker"',
        f'[stores."{store.name}".transports.broker]',
        *(f'"{name}" = "{value}"' for name, value in transport.items()),
    ]
    path = Path(folder) / "relayer.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# -- processes ------------------------------------------------------------------------------


def child_environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("RELAYER_")}
    env["PYTHONFAULTHANDLER"] = "1"
    return env


class WorkerProcess:
    """A worker in a process of its own, its log in a file; ready once it logs "serving"."""

    def __init__(self, command: list[str], folder: str) -> None:
        self.command = command
        self.log = Path(folder) / "worker.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def check(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"the worker exited ({self.process.returncode}):\n{self.tail()}")

    async def __aenter__(self) -> WorkerProcess:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.command,
                env=child_environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while " serving " not in self.tail():
            self.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not serve within 60 s:\n{self.tail()}")
            await asyncio.sleep(0.05)
        return self

    async def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, 60)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            await asyncio.to_thread(process.wait, 30)
            print(f"the worker did not stop within 60 s:\n{self.tail()}")

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def cli_worker(config: str, store: StoreSettings, folder: str) -> WorkerProcess:
    command = [sys.executable, "-m", "relayer", "--config", config, "run", store.name]
    return WorkerProcess(command, folder)


class Child:
    """A child of efficiency_children.py: set up, ready, go, one JSON result."""

    def __init__(self, kind: str, options: dict[str, Any]) -> None:
        self.kind = kind
        self.options = options
        self.process: asyncio.subprocess.Process | None = None
        # Its log (librdkafka's configuration warnings, say) is shown only if it fails.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115

    async def start(self) -> dict[str, Any]:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(CHILDREN),
            self.kind,
            json.dumps(self.options),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self.log,
            env=child_environment(),
        )
        return (await self._line())["ready"]  # type: ignore[no-any-return]

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def go(self) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        await self.process.stdin.drain()

    async def result(self) -> dict[str, Any]:
        assert self.process is not None
        line = await self._line()
        await self.process.wait()
        self.log.close()
        return line

    async def _line(self) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        text = await self.process.stdout.readline()
        if not text:
            await self.process.wait()
            self.log.seek(0)
            output = self.log.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"{self.kind} child exited ({self.process.returncode}):\n{output}")
        return json.loads(text)  # type: ignore[no-any-return]


def backends_of(
    conn: psycopg.AsyncConnection[Any], store: str
) -> Callable[[], Awaitable[list[int]]]:
    """The pids of the worker's PostgreSQL sessions: application_name relayer:...STORE...
    (the store's name is unique to the run, so other users' relayer sessions never match)."""
    query = (
        "SELECT pid FROM pg_catalog.pg_stat_activity "
        "WHERE application_name LIKE 'relayer:%%' "
        "AND pg_catalog.strpos(application_name, %s) > 0"
    )

    async def pids() -> list[int]:
        cursor = await conn.execute(query, (f":{store}",))
        return [int(row[0]) for row in await cursor.fetchall()]

    return pids


async def outbox_empty(conn: psycopg.AsyncConnection[Any], store: StoreSettings) -> bool:
    table = sql.Identifier(store.db_schema, store.names.table("outbox"))
    cursor = await conn.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(table))
    return await cursor.fetchone() is None


# -- contenders -------------------------------------------------------------------------------


async def relay_drain(environment: Environment, transport: str, lanes: int) -> Row:
    arguments = environment.arguments
    rows = arguments.rows
    with (
        scratch_schema(environment.dsn, "efficiency") as schema_name,
        tempfile.TemporaryDirectory() as folder,
    ):
        options = transport_options(environment, transport)
        store = await applied(
            make_store(
                environment.dsn, schema_name, options, notify=True, name=schema_name, lanes=lanes
            )
        )
        config = write_config(store, options, folder)
        async with (
            destination(environment, transport) as target,
            await psycopg.AsyncConnection.connect(environment.dsn, autocommit=True) as monitor,
            cli_worker(config, store, folder) as worker,
        ):
            await asyncio.sleep(1)  # membership settled, lanes scheduled
            async with await psycopg.AsyncConnection.connect(environment.dsn) as writer:
                await write_backlog(writer, store, rows, target, commit=False)
                meter = Meter(
                    {"worker": worker.pid, "broker": environment.broker_pids.get(transport, [])},
                    {"backends": backends_of(monitor, store.name)},
                    split={"worker"},
                )
                await meter.start()
                await writer.commit()
                committed = time.perf_counter()
            while not await outbox_empty(monitor, store):
                worker.check()
                await asyncio.sleep(0.02)
            seconds = time.perf_counter() - committed
            window = await meter.stop()
    label = {"kafka": "Kafka", "rabbitmq": "RabbitMQ", "memory": "memory"}[transport]
    path = f"relay -> {label}" + (f" ({lanes:,} lanes)" if lanes != DEFAULT_LANES else "")
    row = window_row(path, window, rows, rows / seconds)
    if transport not in environment.broker_pids:
        row.broker = None
    return row


async def bare_kafka(environment: Environment) -> Row:
    from bench.transport_bare import create_topic

    assert environment.bootstrap is not None
    topic = await asyncio.to_thread(create_topic, environment.bootstrap)
    options = {
        "bootstrap": environment.bootstrap,
        "topic": topic,
        "rows": environment.arguments.rows,
    }
    return await bare("bare confluent-kafka producer", environment, "kafka", "bare-kafka", options)


async def bare_rabbitmq(environment: Environment) -> Row:
    url = environment.arguments.rabbitmq_url
    async with rabbitmq_queue(url) as queue:
        options = {"url": url, "queue": queue, "rows": environment.arguments.rows}
        label = "bare RabbitMQ publisher (aio-pika)"
        return await bare(label, environment, "rabbitmq", "bare-rabbitmq", options)


async def bare(
    label: str, environment: Environment, transport: str, kind: str, options: dict[str, Any]
) -> Row:
    child = Child(kind, options)
    await child.start()
    meter = Meter({"broker": environment.broker_pids.get(transport, [])})
    await meter.start()
    await child.go()
    result = await child.result()
    window = await meter.stop()
    rows = options["rows"]
    return Row(
        label,
        rows / result["seconds"],
        per_message(result["main"], rows),
        per_message(max(result["process"] - result["main"], 0.0), rows),
        None,
        per_message(window.group("broker"), rows) if transport in environment.broker_pids else None,
    )


async def least_postgres_work(environment: Environment) -> Row:
    rows = environment.arguments.rows
    with scratch_schema(environment.dsn, "efficiency") as schema_name:
        store = await applied(make_store(environment.dsn, schema_name, name=schema_name))
        async with await psycopg.AsyncConnection.connect(environment.dsn) as conn:
            await write_backlog(conn, store, rows, "events", commit=True)
        child = Child(
            "floor",
            {
                "dsn": environment.dsn,
                "schema": store.db_schema,
                "outbox": store.names.table("outbox"),
                "leases": store.names.table("leases"),
                "lanes": store.lanes,
            },
        )
        await child.start()
        await child.go()
        result = await child.result()
    row = Row(
        "least PostgreSQL work (lock lane, SELECT 500, DELETE by ids, COMMIT)",
        result["rows"] / result["seconds"],
        per_message(result["main"], result["rows"]),
        per_message(max(result["process"] - result["main"], 0.0), result["rows"]),
    )
    if result["backend"] is not None:
        row.backends = per_message(result["backend"], result["rows"])
    else:
        row.notes.append("PostgreSQL runs on another machine: its backend's CPU is not measured")
    return row


# -- the run -----------------------------------------------------------------------------------


def contenders(environment: Environment) -> list[tuple[str, Callable[[], Awaitable[Row]]]]:
    chosen = environment.arguments.transports
    lanes = environment.arguments.lanes
    found: list[tuple[str, Callable[[], Awaitable[Row]]]] = []

    def relay(transport: str, lane_count: int) -> Callable[[], Awaitable[Row]]:
        return lambda: relay_drain(environment, transport, lane_count)

    for transport in TRANSPORTS:
        if transport not in chosen:
            continue
        for lane_count in lanes:
            found.append((f"relay {transport} {lane_count}", relay(transport, lane_count)))
        if transport == "kafka":
            found.append(("bare kafka", lambda: bare_kafka(environment)))
        if transport == "rabbitmq":
            found.append(("bare rabbitmq", lambda: bare_rabbitmq(environment)))
    found.append(("floor", lambda: least_postgres_work(environment)))
    return found


def median_row(rows: list[Row]) -> Row:
    if len(rows) == 1:
        return rows[0]

    def middle(values: Iterable[float | None]) -> float | None:
        present = [value for value in values if value is not None]
        return statistics.median(present) if present else None

    names = {name for row in rows for name in row.other_names}
    return Row(
        rows[0].path,
        statistics.median(row.rate for row in rows),
        middle(row.main for row in rows),
        middle(row.other for row in rows),
        middle(row.backends for row in rows),
        middle(row.broker for row in rows),
        {name: middle(row.other_names.get(name, 0.0) for row in rows) or 0.0 for name in names},
        sorted({note for row in rows for note in row.notes}),
    )


async def measure_all(environment: Environment) -> dict[str, Row]:
    runs = contenders(environment)
    results: dict[str, list[Row]] = {name: [] for name, _ in runs}
    rounds = environment.arguments.rounds
    for number in range(1, rounds + 1):
        order = runs if number % 2 else list(reversed(runs))
        for name, run in order:
            row = await run()
            results[name].append(row)
            if rounds > 1:
                print(
                    f"round {number}: {row.path}: {row.rate:,.0f} msg/s, {row.total:.1f} µs/msg",
                    flush=True,
                )
    return {name: median_row(rows) for name, rows in results.items()}


def cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(rows: list[Row], rounds: int) -> None:
    print()
    print("CPU µs per message" + (f" (medians of {rounds} rounds)" if rounds > 1 else "") + ":")
    print()
    print(
        "| path | msg/s | worker main thread µs/msg | worker other threads | its PG backends "
        "| broker | total |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row.path} | {row.rate:,.0f} | {cell(row.main)} | {cell(row.other)} | "
            f"{cell(row.backends)} | {cell(row.broker)} | {row.total:.1f} |"
        )
    print()
    for row in rows:
        named = ", ".join(
            f"{name} {value:.1f}" for name, value in row.other_names.items() if value >= 0.05
        )
        if named:
            print(f"- {row.path}, other threads: {named}")
        for note in row.notes:
            print(f"- {row.path}: {note}")


def print_limits(results: dict[str, Row], environment: Environment) -> None:
    floor = results["floor"]
    cores = os.cpu_count() or 1
    floor_cost = (floor.main or 0.0) + (floor.other or 0.0) + (floor.backends or 0.0)
    print()
    print(
        f"Physical limit per message = floor ({floor_cost:.1f}: client + backend) "
        "+ bare producer + broker:"
    )
    for transport, bare_name, label in (
        ("kafka", "bare kafka", "Kafka"),
        ("rabbitmq", "bare rabbitmq", "RabbitMQ"),
    ):
        if bare_name not in results:
            continue
        bare_row = results[bare_name]
        limit = floor_cost + bare_row.total
        line = f"- {label}: {limit:.1f} µs/msg ({cores * 1e6 / limit:,.0f} msg/s on {cores} cores)"
        relay = results.get(f"relay {transport} {DEFAULT_LANES}")
        if relay is not None:
            line += f"; relayer spends {relay.total:.1f}: {limit / relay.total:.0%} of the limit"
        print(line)
    if "rabbitmq" in environment.arguments.transports:
        print(
            "- RabbitMQ's beam.smp serves every user of the shared server: "
            "its figures include their load"
        )


def commit() -> str:
    def git(*arguments: str) -> str:
        return subprocess.run(
            ["git", *arguments], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return head + (" (with uncommitted changes)" if dirty else "")


async def main_async(arguments: argparse.Namespace) -> None:
    with postgres(arguments.dsn) as dsn, contextlib.ExitStack() as stack:
        print(f"machine: {machine()}; {server_version(dsn)}")
        print(f"commit: {commit()}")
        print("command: " + shlex.join([Path(sys.executable).name, *sys.argv]))
        environment = Environment(dsn, arguments)
        if "kafka" in arguments.transports:
            environment.bootstrap = stack.enter_context(kafka_broker(arguments.kafka_bootstrap))
            pids = tansu_pids(environment.bootstrap)
            if pids:
                environment.broker_pids["kafka"] = pids
            where = arguments.kafka_bootstrap or "embedded tansu"
            print(
                f"Kafka: {where}"
                + ("" if pids else " (not a local tansu process: its CPU is not measured)")
            )
        if "rabbitmq" in arguments.transports:
            pids = rabbitmq_pids()
            if pids:
                environment.broker_pids["rabbitmq"] = pids
        results = await measure_all(environment)
        print_table(list(results.values()), arguments.rounds)
        print_limits(results, environment)


def transports(text: str) -> list[str]:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    for name in chosen:
        if name not in TRANSPORTS:
            raise argparse.ArgumentTypeError(
                f"unknown transport {name!r}: choose from {', '.join(TRANSPORTS)}"
            )
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="default: RELAYER_BENCH_DSN, else an embedded PostgreSQL")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument(
        "--transport",
        dest="transports",
        type=transports,
        default=list(TRANSPORTS),
        help="comma-separated: kafka,rabbitmq,memory",
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--lanes", type=int, nargs="*", default=[])
    parser.add_argument("--kafka-bootstrap", help="default: an embedded tansu broker")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    arguments = parser.parse_args()
    arguments.lanes = [
        DEFAULT_LANES,
        *(lanes for lanes in arguments.lanes if lanes != DEFAULT_LANES),
    ]
    asyncio.run(main_async(arguments))


if __name__ == "__main__":
    main()
