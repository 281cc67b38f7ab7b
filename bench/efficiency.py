"""Efficiency: CPU per message of every process on the data path, against the machine's limit.

    python bench/efficiency.py [--rows 100000]
                               [--transport kafka,rabbitmq,nats,redis,webhooks,sqs,memory]
                               [--rounds 1] [--http-rows 5000]
                               [--no-steady] [--no-drains] [--steady-seconds 30]
                               [--steady-rate 1000] [--instructions]
                               [--lanes 65536]

Contenders, measured in one run against the same PostgreSQL and brokers:
- relay -> Kafka / RabbitMQ / NATS JetStream / Redis Streams / webhooks / SQS / memory:
  ``relayer --config
  FILE run STORE`` (the real CLI, default worker settings; the store has 64 lanes, the default
  batch size and notify on) started on an empty outbox; once it serves and has relayed 1,000
  unmeasured rows, N rows (200-byte bodies, 10,000 keys) are written in ONE transaction; CPU
  counters are read right before its COMMIT and again when the outbox is empty.
  msg/s = N / (empty - committed).
- bare confluent-kafka producer, bare RabbitMQ publisher (aio-pika, pipelined confirms), bare
  NATS publisher (nats-py, 1,000 acknowledgements outstanding) and bare Redis client (XADDs in
  pipelines of 1,000: bench/queued_brokers.py), bare webhook client (httpx, signed POSTs, 50 at
  once) and bare SQS client (aiobotocore, SendMessageBatch of 10, 100 requests outstanding:
  bench/http_endpoints.py), in a child process, the same messages from memory; the child
  measures its own CPU around the send loop only. Webhooks go to a receiver
  (tests/webhook_receiver.py) and SQS to moto's server (tests/sqs_server.py), each a local
  process of its own whose CPU is the broker's; their drains send --http-rows rows.
- the least PostgreSQL work: a child that, per lane and in one transaction, locks the lane's
  lease row, reads 500 rows head first, deletes them by an id array and commits; its own CPU
  and its backend's.
CPU is user + system time from /proc: per thread (schedstat, in ns) for the worker (the main
thread apart from the others), the worker's PostgreSQL backends (pg_stat_activity rows whose
application_name is relayer:STORE:..., the store's name being unique to the run) and the broker
(tansu's process, RabbitMQ's beam.smp, nats-server or redis-server: other users of a shared
server pollute the last three).
The physical limit per message is the floor (client + backend) + the bare producer + the
broker's CPU per message under the bare producer; relayer's fraction is limit / relayer total.

Steady mode (on by default, to Kafka if selected): a writer process commits one row per
transaction at --steady-rate rows/s for --steady-seconds; a worker relays them. Reported: all
CPU per message over the window after a warm-up (worker, its sessions, broker; the writer and
its sessions apart) and commit-to-ack p50/p99. To Kafka it then runs the least relay under the
same writers at the same rate (one blocking loop: LISTEN, lock the lanes named, read, produce,
wait for the deliveries, delete, commit), whose CPU per message and commit-to-ack are what the
machine allows at that rate, and the bare producer at that rate. --instructions runs the worker
and the least relay under valgrind's callgrind and prints the instructions each executes a row
(a figure that repeats within about 1% where CPU seconds move 2x; keep the rate low, e.g. 20).
--lanes 65536 adds a drain with that many lanes and an idle worker owning them. Prints
figures; asserts nothing.
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
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from bench.common import machine, postgres, scratch_schema, server_version
from bench.cpu import Meter, Window
from bench.efficiency_processes import (
    Callgrind,
    Child,
    Environment,
    backends_of,
    cli_worker,
    destination,
    drained,
    rabbitmq_pids,
    rabbitmq_queue,
    tansu_pids,
    transport_options,
    write_config,
)
from bench.efficiency_steady import LABELS, idle, steady
from bench.http_endpoints import SQS_OPTIONS, sqs_server, webhook_receiver
from bench.queued_brokers import nats_pids, redis_pids
from bench.relay import applied, make_store, write_backlog
from bench.transport_bare import kafka_cluster
from relayer.redact import redact

ROOT = Path(__file__).resolve().parents[1]
TRANSPORTS = ("kafka", "rabbitmq", "nats", "redis", "webhooks", "sqs", "memory")
HTTP = ("webhooks", "sqs")
DEFAULT_LANES = 64
WARM_UP_ROWS = 1_000  # relayed before each drain's backlog, not measured


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
    if not window.has("backends"):
        row.notes.append(
            "no PostgreSQL session of the worker found (application_name relayer:...STORE..., "
            "on this machine's PostgreSQL): its backends' CPU is not counted"
        )
    for group, count in window.vanished.items():
        row.notes.append(
            f"{count} {group} thread(s)/backend(s) exited mid-run (CPU to last sample)"
        )
    return row


# -- contenders -------------------------------------------------------------------------------


async def relay_drain(environment: Environment, transport: str, lanes: int) -> Row:
    arguments = environment.arguments
    rows = rows_of(arguments, transport)
    with (
        scratch_schema(environment.dsn, "efficiency") as schema_name,
        tempfile.TemporaryDirectory() as folder,
    ):
        options = transport_options(environment, transport)
        store = await applied(
            make_store(
                environment.dsn,
                schema_name,
                options,
                notify=True,
                name=schema_name,
                lanes=lanes,
                storage=arguments.storage,
            )
        )
        config = write_config(
            store,
            options,
            folder,
            [f'storage = "{arguments.storage}"', *environment.arguments.store_options],
        )
        async with (
            destination(environment, transport) as target,
            await psycopg.AsyncConnection.connect(environment.dsn, autocommit=True) as monitor,
            cli_worker(config, store, folder) as worker,
        ):
            async with await psycopg.AsyncConnection.connect(environment.dsn) as writer:
                # Unmeasured: the pool's connections, the producer's id and the topic's
                # metadata are in place before the backlog, as in a worker that has been up.
                await write_backlog(writer, store, WARM_UP_ROWS, target, commit=True)
                await drained(monitor, store, worker)
                await write_backlog(writer, store, rows, target, commit=False)
                meter = Meter(
                    {"worker": worker.pid, "broker": environment.broker_pids.get(transport, [])},
                    {"backends": backends_of(monitor, store.name)},
                    split={"worker"},
                )
                await meter.start()
                await writer.commit()
                committed = time.perf_counter()
            await drained(monitor, store, worker)
            seconds = time.perf_counter() - committed
            window = await meter.stop()
    path = f"relay -> {LABELS[transport]}" + (
        f" ({lanes:,} lanes)" if lanes != DEFAULT_LANES else ""
    )
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
        options = {"url": url, "queue": queue, "rows": environment.arguments.rabbitmq_rows}
        label = "bare RabbitMQ publisher (aio-pika)"
        return await bare(label, environment, "rabbitmq", "bare-rabbitmq", options)


async def bare_queued(environment: Environment, transport: str) -> Row:
    """The bare NATS publisher or Redis client (bench/queued_brokers.py)."""
    async with destination(environment, transport) as target:
        url = getattr(environment.arguments, f"{transport}_url")
        options = {"url": url, "destination": target, "rows": environment.arguments.rows}
        label = {"nats": "bare NATS publisher (nats-py)", "redis": "bare Redis XADD (redis-py)"}
        return await bare(label[transport], environment, transport, f"bare-{transport}", options)


def rows_of(arguments: argparse.Namespace, transport: str) -> int:
    """Rows of a drain (and of its bare client): fewer where each costs a round trip."""
    if transport == "rabbitmq":
        return int(arguments.rabbitmq_rows)
    if transport in HTTP:
        return int(arguments.http_rows)
    return int(arguments.rows)


async def bare_http(environment: Environment, transport: str) -> Row:
    """The bare webhook or SQS client (bench/http_endpoints.py)."""
    async with destination(environment, transport) as target:
        options = {
            **environment.http[transport],
            "destination": target,
            "rows": environment.arguments.http_rows,
        }
        label = {"webhooks": "bare webhook POSTs (httpx)", "sqs": "bare SQS batches (aiobotocore)"}
        return await bare(label[transport], environment, transport, f"bare-{transport}", options)


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
        if transport in ("nats", "redis"):
            found.append(
                (f"bare {transport}", lambda chosen=transport: bare_queued(environment, chosen))
            )
        if transport in HTTP:
            found.append(
                (f"bare {transport}", lambda chosen=transport: bare_http(environment, chosen))
            )
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
            print(f"round {number}/{rounds}: {name} ...", file=sys.stderr, flush=True)
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
        "+ bare producer + broker (the memory transport: the floor alone):"
    )
    for transport in environment.arguments.transports:
        bare_row = results.get(f"bare {transport}")
        limit = floor_cost + (bare_row.total if bare_row is not None else 0.0)
        relay = results[f"relay {transport} {DEFAULT_LANES}"]
        print(
            f"- {LABELS[transport]}: {limit:.1f} µs/msg ({cores * 1e6 / limit:,.0f} msg/s on "
            f"{cores} cores); relayer spends {relay.total:.1f}: {limit / relay.total:.0%} of it"
        )
    if "rabbitmq" in environment.arguments.transports:
        print(
            "- RabbitMQ's beam.smp serves every user of the shared server: its figures include "
            "their load. The bare aio-pika publisher costs more client CPU than relayer's own "
            "frame-writing publisher, so the RabbitMQ limit is not a lower bound"
        )
    if "nats" in environment.arguments.transports:
        print(
            "- The bare nats-py publisher (publish_async: a semaphore, a future and a token a "
            "message) costs more client CPU than relayer's reply inbox, so the NATS limit is "
            "not a lower bound either"
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
    main_task = asyncio.current_task()
    assert main_task is not None
    # SIGTERM unwinds like Ctrl-C: the worker, the children and the scratch schemas go too.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    async with contextlib.AsyncExitStack() as stack_async:
        await measure_in(arguments, stack_async)


async def measure_in(arguments: argparse.Namespace, stack_async: contextlib.AsyncExitStack) -> None:
    """The run, with the HTTP endpoints' servers on ``stack_async``."""
    with postgres(arguments.dsn) as dsn, contextlib.ExitStack() as stack:
        print(f"machine: {machine()}; {server_version(dsn)}")
        print(f"commit: {commit()}")
        print("command: " + shlex.join([Path(sys.executable).name, *sys.argv]))
        environment = Environment(dsn, arguments)
        if "kafka" in arguments.transports:
            environment.bootstrap = stack.enter_context(kafka_cluster(arguments.kafka_bootstrap))
            pids = tansu_pids(environment.bootstrap)
            if pids:
                environment.broker_pids["kafka"] = pids
            where = arguments.kafka_bootstrap or "embedded tansu"
            print(
                f"Kafka: {where}"
                + ("" if pids else " (not a local tansu process: its CPU is not measured)")
            )
        if "rabbitmq" in arguments.transports:
            await reachable(arguments.rabbitmq_url)
            pids = rabbitmq_pids()
            if pids:
                environment.broker_pids["rabbitmq"] = pids
        for transport, find in (("nats", nats_pids), ("redis", redis_pids)):
            if transport in arguments.transports and (pids := find()):
                environment.broker_pids[transport] = pids
        if "webhooks" in arguments.transports:
            url, secret, pid = await stack_async.enter_async_context(webhook_receiver())
            environment.http["webhooks"] = {"url": url, "secret": secret}
            environment.broker_pids["webhooks"] = [pid]
        if "sqs" in arguments.transports:
            endpoint, pid = await stack_async.enter_async_context(sqs_server())
            environment.http["sqs"] = {"endpoint_url": endpoint, **SQS_OPTIONS}
            environment.broker_pids["sqs"] = [pid]
        if arguments.drains:
            results = await measure_all(environment)
            print_table(list(results.values()), arguments.rounds)
            print_limits(results, environment)
            if len(arguments.lanes) > 1:
                await print_lanes(results, environment)
        if arguments.steady:
            chosen = arguments.transports
            await steady(environment, "kafka" if "kafka" in chosen else chosen[0])


async def print_lanes(results: dict[str, Row], environment: Environment) -> None:
    """Drain rates against 64 lanes, and the CPU of an idle worker serving each lane count."""
    arguments = environment.arguments
    print()
    print(
        f"Lanes: drain rate against {DEFAULT_LANES} lanes, and an idle worker (empty outbox, "
        f"over {arguments.idle_seconds:g} s, from "
        + (
            f"{arguments.idle_settle:g} s after it served"
            if arguments.idle_settle is not None
            else "lease/3 + 2 s after it served, past its joining heartbeats"
        )
        + "):"
    )
    for transport in arguments.transports:
        base = results[f"relay {transport} {DEFAULT_LANES}"]
        for lanes in arguments.lanes[1:]:
            row = results[f"relay {transport} {lanes}"]
            print(
                f"- {transport}, {lanes:,} lanes: {row.rate:,.0f} msg/s = "
                f"{row.rate / base.rate:.2f}x the {DEFAULT_LANES}-lane rate"
            )
    transport = arguments.transports[0]
    for lanes in arguments.lanes:
        worker, backends = await idle(environment, transport, lanes)
        print(
            f"- idle worker owning {lanes:,} lanes ({transport}): worker {worker:.1%} of a core, "
            f"its PG backends {backends:.1%}, total {worker + backends:.1%}"
        )


async def reachable(url: str) -> None:
    import aio_pika

    try:
        connection = await aio_pika.connect(url, timeout=10)
    except Exception as exc:
        raise SystemExit(
            f"efficiency.py: error: RabbitMQ at {redact(url)} does not answer: {exc}"
        ) from None
    await connection.close()


def bounded(kind: type[int] | type[float], low: float, high: float | None = None) -> Any:
    """An argparse type: a number of ``kind`` within [low, high], else a one-line error."""
    rule = f"at least {low:g}" if high is None else f"{low:g} to {high:g}"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number ({rule})") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {rule}")
        return value

    return parse


FENCED_VARIANTS = ("probe+claim", "probe", "claim", "bare")


def fenced_variant(text: str) -> str:
    if text not in FENCED_VARIANTS:
        raise argparse.ArgumentTypeError(
            f"--fenced: {text!r} is not a variant (one of {', '.join(FENCED_VARIANTS)})"
        )
    return text


def transports(text: str) -> list[str]:
    chosen = [name.strip() for name in text.split(",") if name.strip()]
    for name in chosen:
        if name not in TRANSPORTS:
            raise argparse.ArgumentTypeError(
                f"unknown transport {name!r}: choose from {', '.join(TRANSPORTS)}"
            )
    return chosen


def store_option(text: str) -> str:
    """``name=value`` as a TOML line of the store's section (the value a TOML string unless it
    is a number or a boolean)."""
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name.isidentifier() or not value:
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE (e.g. wake_linger=6ms), got {text!r}"
        )
    try:
        float(value)
    except ValueError:
        if value not in ("true", "false"):
            value = json.dumps(value)
    return f"{name} = {value}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="default: RELAYER_BENCH_DSN, else an embedded PostgreSQL")
    parser.add_argument("--rows", type=bounded(int, 1), default=100_000)
    parser.add_argument(
        "--storage",
        choices=("delete", "partitioned"),
        default="delete",
        help="the relay contenders' storage mode (docs/storage.md)",
    )
    parser.add_argument(
        "--transport",
        dest="transports",
        type=transports,
        default=list(TRANSPORTS),
        help="comma-separated: kafka,rabbitmq,nats,redis,webhooks,sqs,memory",
    )
    parser.add_argument(
        "--http-rows",
        type=bounded(int, 1),
        default=5_000,
        help="rows of the webhooks and SQS drains and bare clients (a round trip a key's row)",
    )
    parser.add_argument(
        "--rabbitmq-rows",
        type=bounded(int, 1),
        default=20_000,
        help="rows of the RabbitMQ drain and bare publisher (confirms are far slower)",
    )
    parser.add_argument(
        "--rounds", type=bounded(int, 1), default=1, help="contenders alternated; medians reported"
    )
    parser.add_argument(
        "--lanes",
        type=bounded(int, 1, 65_536),
        nargs="*",
        default=[],
        help=f"lane counts to drain and idle with besides {DEFAULT_LANES} (e.g. 65536)",
    )
    parser.add_argument("--idle-seconds", type=bounded(float, 0.5), default=10.0)
    parser.add_argument(
        "--idle-settle",
        type=bounded(float, 0.0),
        default=None,
        help="seconds after the worker serves before the idle window (default: lease/3 + 2, "
        "past the joining member's one-second heartbeats)",
    )
    parser.add_argument(
        "--steady",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="steady mode, to Kafka if selected (else the first transport)",
    )
    parser.add_argument(
        "--drains",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the backlog drains, bare contenders and limits (--no-drains: the steady mode only)",
    )
    parser.add_argument(
        "--steady-seconds", type=bounded(float, 3), default=30.0, help="warm-up included"
    )
    parser.add_argument("--steady-rate", type=bounded(float, 1), default=1000.0)
    parser.add_argument(
        "--least-ticks",
        type=lambda text: [bounded(float, 0.1)(part) for part in text.split(",") if part],
        default=[5.0, 10.0],
        help="steady mode to Kafka: the polled least relay's ticks in ms, comma-separated "
        "(default 5,10; '' for none)",
    )
    parser.add_argument(
        "--fenced",
        type=lambda text: [fenced_variant(part) for part in text.split(",") if part],
        default=["probe+claim", "probe"],
        help="steady mode to Kafka: the fenced least relay's variants at the first of "
        "--least-ticks, comma-separated among probe+claim, probe, claim, bare (its steps "
        "besides the lock, read and fenced delete; default probe+claim,probe; '' for none)",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="steady mode: run the worker and the least relay under valgrind's callgrind and "
        "print the instructions each executes a row (repeatable where CPU seconds are not; "
        "about 50x slower: use a low --steady-rate, e.g. 20)",
    )
    parser.add_argument(
        "--store-option",
        dest="store_options",
        type=store_option,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a store setting for every relay contender, e.g. wake_linger=6ms (repeatable)",
    )
    parser.add_argument("--kafka-bootstrap", help="default: an embedded tansu broker")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    arguments = parser.parse_args()
    if arguments.instructions and (missing := Callgrind.missing()):
        parser.error(f"--instructions needs {' and '.join(missing)} on PATH (valgrind's package)")
    arguments.lanes = [
        DEFAULT_LANES,
        *(lanes for lanes in arguments.lanes if lanes != DEFAULT_LANES),
    ]
    try:
        asyncio.run(main_async(arguments))
    except (KeyboardInterrupt, asyncio.CancelledError):  # everything it started is gone
        raise SystemExit("efficiency.py: interrupted") from None


if __name__ == "__main__":
    main()
