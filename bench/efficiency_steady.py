"""bench/efficiency.py's steady and idle modes: CPU per message at a production-like rate, with
commit-to-acknowledgement latency, and the CPU of a worker that has nothing to send."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.ack_plugin import ENTRY_POINT, register
from bench.common import scratch_schema
from bench.cpu import Meter, Window, cold_work
from bench.efficiency_children import BARE_ACK_EVERY, WRITER_CONNECTIONS, WRITER_PROCESSES
from bench.efficiency_processes import (
    CHILDREN,
    Callgrind,
    Child,
    Environment,
    WorkerProcess,
    backends_of,
    cli_worker,
    destination,
    drained,
    transport_options,
    write_config,
)
from bench.relay import applied, make_store

WARM_UP = 5.0  # seconds of writing before the measured window opens
ACK_SAMPLE = 4  # one message in this many gets an acknowledgement time
SETTLE = 2.0  # the least wait after "serving" before the idle window opens

LABELS = {
    "kafka": "Kafka",
    "rabbitmq": "RabbitMQ",
    "nats": "NATS JetStream",
    "redis": "Redis Streams",
    "webhooks": "webhooks",
    "sqs": "SQS (moto)",
    "memory": "memory",
}


class Steady:
    """One steady run's set-up: a scratch store with notifications, its worker TOML, and the
    writers' commit times once they are done."""

    def __init__(self, environment: Environment, transport: str) -> None:
        self.environment = environment
        self.transport = transport
        arguments = environment.arguments
        self.rate, self.seconds = arguments.steady_rate, arguments.steady_seconds
        self.warm_up = min(WARM_UP, self.seconds / 3)
        # --instructions: the relays run under callgrind; their instructions a row, by name.
        self.instructions: bool = arguments.instructions
        self.per_row: dict[str, float] = {}

    def counter(self, folder: str, name: str) -> Callgrind | None:
        return Callgrind(folder, name) if self.instructions else None

    def start_within(self) -> float:
        return 600.0 if self.instructions else 60.0

    async def run(
        self,
        store: Any,
        config: str,
        folder: str,
        target: str,
        relay: Any,
        backends: Callable[[], Awaitable[list[int]]],
        counter: Callgrind | None = None,
    ) -> tuple[Window, float, float, dict[str, float], int | None]:
        """Write at the steady rate while ``relay`` (a process with ``pid`` and ``check()``)
        relays; the meter's window, when it opened and closed, every row's commit time, and
        the relay's instructions in the window if ``counter`` counts them."""
        environment = self.environment
        await asyncio.sleep(1)  # membership settled, lanes scheduled
        writers = [
            Child(
                "writer",
                {
                    "config": config,
                    "store": store.name,
                    "destination": target,
                    "rate": self.rate,
                    "seconds": self.seconds,
                    "process": number,
                    "out": str(Path(folder) / f"committed-{number}.json"),
                    "application_name": f"efficiency-writer:{store.name}",
                },
            )
            for number in range(WRITER_PROCESSES)
        ]
        writer_backends = [pid for writer in writers for pid in (await writer.start())["backends"]]

        async def writer_sessions() -> list[int]:
            return writer_backends

        for writer in writers:
            await writer.go()
        await asyncio.sleep(self.warm_up)
        meter = Meter(
            {
                "worker": relay.pid,
                "broker": environment.broker_pids.get(self.transport, []),
                "writer": [writer.pid for writer in writers],
            },
            {"backends": backends, "writer backends": writer_sessions},
            split={"worker"},
        )
        await meter.start()
        if counter is not None:
            await counter.begin(relay.pid)
        opened = time.time()
        await asyncio.sleep(self.seconds - self.warm_up - 0.5)  # closes before the writers stop
        window = await meter.stop()
        closed = time.time()
        counted = None if counter is None else await counter.end(relay.pid)
        for writer in writers:
            await writer.result()
        async with await psycopg.AsyncConnection.connect(
            environment.dsn, autocommit=True
        ) as monitor:
            await drained(monitor, store, relay)
        committed: dict[str, float] = {}
        for number in range(WRITER_PROCESSES):
            committed.update(json.loads((Path(folder) / f"committed-{number}.json").read_text()))
        return window, opened, closed, committed, counted


async def steady(environment: Environment, transport: str) -> None:
    run = Steady(environment, transport)
    with (
        scratch_schema(environment.dsn, "efficiency") as schema_name,
        tempfile.TemporaryDirectory() as folder,
    ):
        options = transport_options(environment, transport)
        store = await applied(
            make_store(environment.dsn, schema_name, options, notify=True, name=schema_name)
        )
        acks = Path(folder) / "acks.json"
        command, env, config = steady_worker(run, store, options, folder, acks)
        counter = run.counter(folder, "worker")
        if counter is not None:
            command = counter.prefix() + command
        async with (
            destination(environment, transport) as target,
            await psycopg.AsyncConnection.connect(environment.dsn, autocommit=True) as monitor,
            WorkerProcess(command, folder, start_within=run.start_within(), env=env) as worker,
        ):
            window, opened, closed, committed, counted = await run.run(
                store, config, folder, target, worker, backends_of(monitor, store.name), counter
            )
            await worker.stop()
        sampled: dict[str, Any] = json.loads(acks.read_text()) if acks.exists() else {}
    inside = sum(1 for at in committed.values() if opened <= at < closed)
    print_steady(environment, transport, window, inside, committed, sampled, opened)
    if counted is not None:
        per_row = run.per_row["relayer"] = counted / max(inside, 1)
        batching = sampled.get("batching") or {}
        rows_each = (
            batching["sent"] / batching["transactions"] if batching.get("transactions") else 0
        )
        print(
            f"- instructions (callgrind, every thread of the worker, over the window): "
            f"{per_row:,.0f} a row committed in the window ({rows_each:.1f} rows "
            "a transaction over the run); the worker ran under callgrind, so its CPU and "
            "latency figures above are callgrind's, not the worker's"
        )
    if transport == "kafka":
        await steady_floor(run)
        for tick in environment.arguments.least_ticks:
            await steady_floor(run, tick=tick / 1000)
        ticks = environment.arguments.least_ticks
        for variant in environment.arguments.fenced if ticks else []:
            await steady_floor(run, tick=ticks[0] / 1000, fenced=variant)
        await steady_bare_kafka(environment)
        for tick in environment.arguments.least_ticks:
            await steady_bare_kafka(environment, tick=tick / 1000)
    print_cold_work()


def steady_worker(
    run: Steady, store: Any, options: dict[str, Any], folder: str, acks: Path
) -> tuple[list[str], dict[str, str], str]:
    """The steady mode's worker: its command, the environment it adds, its TOML. To Kafka,
    ``relayer run`` itself (``python -m relayer --config FILE run STORE``) with the Kafka
    transport wrapped by the bench.ack_plugin plug-in, which times one acknowledgement in
    ACK_SAMPLE; to the others, relayer.worker.Worker built from the same TOML
    (efficiency_children.worker), its transports wrapped the same way."""
    store_options = run.environment.arguments.store_options
    config = write_config(store, options, folder, store_options)  # the writers' too
    if options.get("type") != "kafka":
        child = {"config": config, "store": store.name, "acks": str(acks), "every": ACK_SAMPLE}
        return [sys.executable, str(CHILDREN), "worker", json.dumps(child)], {}, config
    plugged = {**options, "type": ENTRY_POINT, "acks_file": str(acks), "every": ACK_SAMPLE}
    own = Path(folder) / "worker"
    own.mkdir()
    worker_config = write_config(store, plugged, str(own), store_options)
    root = str(Path(__file__).resolve().parents[1])
    plugins = register(str(Path(folder) / "plugins"))
    command = [sys.executable, "-m", "relayer", "--config", worker_config, "run", store.name]
    return command, {"PYTHONPATH": os.pathsep.join((plugins, root))}, config


COLD_GAPS = (0.0, 0.001, 0.005)


def print_cold_work() -> None:
    """How much more the same work costs on this machine after a sleep (bench.cpu.cold_work):
    the steady mode's figures include that, a drain's do not."""
    costs = cold_work(COLD_GAPS)
    hot, after_1ms, after_5ms = (costs[gap] for gap in COLD_GAPS)
    print(
        f"- the same piece of interpreter work costs {hot:.1f} µs of CPU back to back, "
        f"{after_1ms:.1f} after a 1 ms sleep and {after_5ms:.1f} after a 5 ms sleep on this "
        f"machine ({after_1ms / hot:.1f}x and {after_5ms / hot:.1f}x; nothing else of the "
        "benchmark running): code that waits between steps, as every process here does at a "
        "steady rate, pays that on every step; a drain runs back to back"
    )


class FloorProcess:
    """The floor-steady child as Steady.run follows a relay: ``pid``, ``check()``; ``stop()``
    ends its loop and returns its result."""

    def __init__(self, child: Child) -> None:
        self.child = child

    @property
    def pid(self) -> int:
        return self.child.pid

    def check(self) -> None:
        process = self.child.process
        if process is not None and process.returncode is not None:
            raise RuntimeError(f"the floor relay exited ({process.returncode})")

    async def stop(self) -> dict[str, Any]:
        await self.child.go()  # a second line ends the loop
        return await self.child.result()


async def steady_floor(run: Steady, *, tick: float = 0.0, fenced: str = "") -> None:
    """The least relay (efficiency_children.floor_steady) under the same writers at the same
    rate: what a message costs and how soon the broker has it, at the least, on this machine.
    With ``tick`` (seconds) the polled least relay: no notifications, every lane read at every
    multiple of ``tick``; with ``fenced`` too, the fenced least relay (bench/fenced_floor.py)
    with the steps it names (probe, claim)."""
    environment = run.environment
    assert environment.bootstrap is not None
    with (
        scratch_schema(environment.dsn, "efficiency") as schema_name,
        tempfile.TemporaryDirectory() as folder,
    ):
        options = transport_options(environment, "kafka")
        store = await applied(
            make_store(environment.dsn, schema_name, options, notify=True, name=schema_name)
        )
        # The least relay answering notifications hears one per commit only if the writers notify
        # in their transactions (after the commit a writer's process stays quiet for a while
        # after each wake-up, for workers that poll hot meanwhile, which it does not).
        quiet = [] if tick else ['notify = "in_transaction"']
        config = write_config(
            store, options, folder, [*environment.arguments.store_options, *quiet]
        )
        acks = Path(folder) / "acks.json"
        counter = run.counter(folder, "least-relay")
        async with destination(environment, "kafka") as target:
            child = Child(
                "fenced-floor-steady" if fenced else "floor-steady",
                {
                    "config": config,
                    "store": store.name,
                    "probe": "probe" in fenced,
                    "claim": "claim" in fenced,
                    "dsn": environment.dsn,
                    "schema": store.db_schema,
                    "outbox": store.names.table("outbox"),
                    "leases": store.names.table("leases"),
                    "channel": store.names.notify_channel,
                    "lanes": store.lanes,
                    "bootstrap": environment.bootstrap,
                    "topic": target,
                    "every": ACK_SAMPLE,
                    "acks": str(acks),
                    "tick": tick,
                },
                prefix=() if counter is None else counter.prefix(),
            )
            backend_pids = (await child.start())["backends"]

            async def backends() -> list[int]:
                return list(backend_pids)

            floor = FloorProcess(child)
            await child.go()
            window, opened, closed, committed, counted = await run.run(
                store, config, folder, target, floor, backends, counter
            )
            await floor.stop()
        sampled: dict[str, Any] = json.loads(acks.read_text()) if acks.exists() else {}
    messages = max(sum(1 for at in committed.values() if opened <= at < closed), 1)
    parts = {
        "process": window.group("worker") + window.group("worker other"),
        "its PG backends": window.group("backends"),
        "broker": window.group("broker"),
    }
    costs = ", ".join(f"{name} {spent * 1e6 / messages:.1f}" for name, spent in parts.items())
    total = sum(parts.values()) * 1e6 / messages
    latencies = latencies_of(committed, sampled, opened)
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else None
    latency = (
        f"commit-to-ack p50 {quantiles[49]:.2f} ms, p90 {quantiles[89]:.2f} ms, p99 "
        f"{quantiles[98]:.2f} ms ({len(latencies):,} samples)"
        if quantiles
        else "commit-to-ack not recorded"
    )
    transactions = sampled.get("transactions") or 0
    each = f"{sampled.get('published', 0) / transactions:.1f}" if transactions else "no"
    if fenced:
        steps = {"probe+claim": "probe, claim, ", "probe": "probe, ", "claim": "claim, "}
        print(
            f"- fenced least relay ({fenced}), every {tick * 1000:g} ms (relayer's statements in "
            f"one blocking loop: {steps.get(fenced, '')}lock and read, produce, wait for the "
            f"deliveries, fenced delete with the commit; {each} rows a transaction, "
            f"{sampled.get('probes', 0):,} probes, {sampled.get('claims', 0):,} claims): CPU "
            f"µs/msg {costs}, total {total:.1f}; {latency}: what relayer's protocol costs at "
            "this rate without its machinery"
        )
    elif tick:
        print(
            f"- polled least relay, every {tick * 1000:g} ms (no LISTEN and no lock: at each "
            f"tick one transaction reads every lane's rows, produces them, waits for the "
            f"deliveries, deletes them, commits; {each} rows a transaction): CPU µs/msg "
            f"{costs}, total {total:.1f}; {latency}: what gathering rows for {tick * 1000:g} ms "
            "costs at the least, and how late it makes them"
        )
    else:
        print(
            f"- least relay at the same rate under the same writers (one blocking loop: LISTEN, "
            f"lock the named lanes, read, produce, wait for the deliveries, delete, commit; no "
            f"linger, dispatch or fencing; {each} rows a transaction): CPU µs/msg {costs}, "
            f"total {total:.1f}; {latency}: the least this machine allows at this rate"
        )
    if counted is not None:
        least = counted / messages
        relayer = run.per_row.get("relayer")
        ratio = f"; relayer executes {relayer / least:.2f}x as many" if relayer else ""
        print(
            f"- instructions of the least relay (callgrind, its process, over the window): "
            f"{least:,.0f} a row{ratio}; it ran under callgrind, so its CPU and latency "
            "figures above are callgrind's"
        )


def latencies_of(
    committed: dict[str, float], sampled: dict[str, Any], opened: float
) -> list[float]:
    """Commit-to-ack in ms of the sampled rows committed after ``opened``, sorted."""
    acked: dict[str, float] = sampled.get("acked", {})
    return sorted(
        (acked[message_id] - at) * 1000
        for message_id, at in committed.items()
        if at >= opened and message_id in acked
    )


async def steady_bare_kafka(environment: Environment, *, tick: float = 0.0) -> None:
    """The bare producer at the same rate, a produce call per message as they come: what the
    broker and a client spend per message when nothing is sent together. With ``tick``
    (seconds): the messages of each tick produced together at its end, as a relay that
    gathers rows for that long sends them."""
    from bench.transport_bare import create_topic

    arguments = environment.arguments
    assert environment.bootstrap is not None
    topic = await asyncio.to_thread(create_topic, environment.bootstrap)
    seconds = max(arguments.steady_seconds - min(WARM_UP, arguments.steady_seconds / 3), 1.0)
    group = max(1, round(arguments.steady_rate * tick))  # messages produced together
    child = Child(
        "bare-kafka-steady",
        {
            "bootstrap": environment.bootstrap,
            "topic": topic,
            "rate": arguments.steady_rate,
            "seconds": seconds,
            "group": group,
        },
    )
    await child.start()
    meter = Meter({"broker": environment.broker_pids.get("kafka", [])})
    await meter.start()
    await child.go()
    result = await child.result()
    window = await meter.stop()
    rows = max(result["rows"], 1)
    broker = (
        f"broker {window.group('broker') * 1e6 / rows:.1f} µs/msg"
        if "kafka" in environment.broker_pids
        else "broker not measured (not a local tansu process)"
    )
    if tick:
        print(
            f"- bare producer, the messages of every {tick * 1000:g} ms produced together "
            f"({group} at a time, {result['rows']:,} messages, {result['delivered']:,} "
            f"delivered): producer {result['process'] * 1e6 / rows:.1f} µs/msg, {broker}: "
            f"what the broker costs a message, at the least, when rows are gathered for "
            f"{tick * 1000:g} ms (librdkafka sends a produce request per partition)"
        )
        return
    print(
        f"- bare confluent-kafka producer at the same rate ({result['rows']:,} messages in "
        f"{result['seconds']:.1f} s, one per produce call, {result['delivered']:,} delivered): "
        f"producer {result['process'] * 1e6 / rows:.1f} µs/msg, {broker}: what a request per "
        "message costs the broker and a client at this rate; the relay shares a request among "
        "the rows it sends together"
    )
    if result["quantiles"]:
        p50, p90, p99 = result["quantiles"]
        print(
            f"- its produce-to-delivery-report latency ({result['timed']:,} samples, 1 in "
            f"{BARE_ACK_EVERY}): p50 {p50:.2f} ms, p90 {p90:.2f} ms, p99 "
            f"{p99:.2f} ms: the broker's and client's share of any commit-to-ack "
            "time at this rate (no writer or relay running beside it)"
        )


def print_steady(
    environment: Environment,
    transport: str,
    window: Window,
    messages: int,
    committed: dict[str, float],
    sampled: dict[str, Any],
    opened: float,
) -> None:
    arguments = environment.arguments
    print()
    print(
        f"Steady: {arguments.steady_rate:,.0f} rows/s for {arguments.steady_seconds:g} s to "
        f"{LABELS[transport]}, one row per transaction over {WRITER_PROCESSES} writer processes "
        f"of {WRITER_CONNECTIONS} connections "
        f"({len(committed):,} rows); measured over {window.seconds:.1f} s after the warm-up "
        f"({messages:,} rows committed in the window; {messages / window.seconds:,.0f} rows/s)"
    )
    achieved = messages / window.seconds
    if achieved < 0.9 * arguments.steady_rate:
        print(
            f"- the writer reached only {achieved:,.0f} of {arguments.steady_rate:,.0f} rows/s "
            "(the machine is saturated): the figures below are for that rate"
        )
    print()
    print("| process | CPU µs/msg | % of a core |")
    print("|---|---|---|")
    parts = [
        ("worker main thread", "worker"),
        ("worker other threads", "worker other"),
        ("its PG backends", "backends"),
        ("broker", "broker"),
    ]
    total = 0.0
    for label, group in parts:
        if group == "broker" and transport not in environment.broker_pids:
            print(f"| {label} | - | - |")
            continue
        spent = window.group(group)
        total += spent
        print(f"| {label} | {spent * 1e6 / messages:.1f} | {spent / window.seconds:.1%} |")
    print(
        f"| **total (worker + its sessions + broker)** | **{total * 1e6 / messages:.1f}** | "
        f"{total / window.seconds:.1%} |"
    )
    for label, group in (
        ("writer (not counted)", "writer"),
        ("writer's PG backends", "writer backends"),
    ):
        spent = window.group(group)
        print(f"| {label} | {spent * 1e6 / messages:.1f} | {spent / window.seconds:.1%} |")
    print()
    named = ", ".join(
        f"{name} {seconds * 1e6 / messages:.1f}"
        for name, seconds in window.by_name("worker other").items()
        if seconds * 1e6 / messages >= 0.05
    )
    if named:
        print(f"- worker other threads: {named}")
    batching = sampled.get("batching")
    if batching and batching["transactions"] and batching["sent"]:
        transactions, sent = batching["transactions"], batching["sent"]
        main = window.group("worker") * 1e6 / messages
        lanes = batching.get("lane_batches")
        each = (
            f"{sent / transactions:.1f} rows and {lanes / transactions:.1f} lanes a transaction"
            if lanes is not None
            else f"{sent / transactions:.1f} rows a batch"
        )
        unit = "batch transactions" if lanes is not None else "publish_batch calls (batches)"
        print(
            f"- the worker sent {sent:,} rows in {transactions:,} {unit} over the whole run "
            f"({each}): its main thread spent about {main * sent / transactions:,.0f} µs a "
            "batch (fewer rows a batch, as when acknowledgements come sooner, cost more a "
            "message)"
        )
    for group, count in window.vanished.items():
        print(f"- {count} {group} thread(s)/backend(s) exited mid-window (CPU to last sample)")
    latencies = latencies_of(committed, sampled, opened)
    how = (
        f"measured by a SampledAckClock around the worker's transports (1 message in "
        f"{ACK_SAMPLE}); "
        + (
            "the worker is `relayer run` itself, its Kafka transport wrapped by the "
            "bench.ack_plugin transport plug-in"
            if transport == "kafka"
            else "the worker here is relayer.worker.Worker built from the same TOML by "
            "bench/efficiency_children.py, not the CLI (with the CLI's collector settings)"
        )
    )
    if len(latencies) < 2:
        print(
            f"- commit-to-ack: no acknowledgement recorded ({sampled.get('published', 0):,} "
            "published through publish()): if the transport API changed, adapt "
            "SampledAckClock in bench/efficiency_children.py"
        )
        return
    quantiles = statistics.quantiles(latencies, n=100)
    print(
        f"- commit-to-ack ({len(latencies):,} samples after the warm-up): p50 "
        f"{quantiles[49]:.2f} ms, p90 {quantiles[89]:.2f} ms, p99 {quantiles[98]:.2f} ms, "
        f"max {latencies[-1]:.2f} ms; {how}"
    )


def idle_settle(environment: Environment, store: Any) -> float:
    """Seconds after "serving" before the idle window opens: by default past the first
    lease/3, during which a joining member beats every second (so that workers started together
    agree on their shares at once), so that the window shows a worker that has been idle."""
    chosen: float | None = environment.arguments.idle_settle
    if chosen is not None:
        return chosen
    return max(SETTLE, store.lease_duration.total_seconds() / 3 + SETTLE)


async def idle(environment: Environment, transport: str, lanes: int) -> tuple[float, float]:
    """% of a core (worker process, its PG sessions) of a worker serving ``lanes`` lanes of an
    empty outbox, over ``--idle-seconds``."""
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
        config = write_config(store, options, folder, environment.arguments.store_options)
        async with (
            await psycopg.AsyncConnection.connect(environment.dsn, autocommit=True) as monitor,
            cli_worker(config, store, folder) as worker,
        ):
            await asyncio.sleep(idle_settle(environment, store))
            meter = Meter({"worker": worker.pid}, {"backends": backends_of(monitor, store.name)})
            await meter.start()
            await asyncio.sleep(environment.arguments.idle_seconds)
            window = await meter.stop()
    return window.group("worker") / window.seconds, window.group("backends") / window.seconds
