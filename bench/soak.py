"""Soak: a steady stream through ``relayer run`` on a private PostgreSQL with autovacuum on, a
snapshot held in the middle, and what the outbox costs the server minute by minute, per storage
mode.

    python bench/soak.py [--modes delete,partitioned] [--rate 15000] [--minutes M]
                         [--hold-minutes 10] [--sample-seconds 60] [--batch 50] [--writers 4]
                         [--lock-sample] [--json FILE] [--plot FILE.svg] [--rounds 1]
                         [--partition-span 10m]
    python bench/soak.py --find-max [--rate 5000] [--step-factor 1.25] [--step-samples 3]
    python bench/soak_plot.py FILE.json FILE.svg      # the plot of an earlier run

Each mode (the store setting ``storage``; a mode the setting refuses is skipped with one line)
runs on a PostgreSQL cluster of its own: initdb in a temporary directory, a free port on
127.0.0.1, autovacuum on, the installation's defaults otherwise (binaries: --postgres-bin); it
is removed when the mode ends, on Ctrl-C too. The store has 64 lanes and every other setting its
default; ``relayer run`` relays it to the memory transport, its metrics on a local port.
``--writers`` processes commit ``--batch`` rows a transaction (``Outbox.write_many``, 200-byte
bodies, 10,000 keys) at ``--rate`` rows/s together for ``--minutes`` (default: 10 M rows or
30 minutes, whichever is shorter); one session holds a REPEATABLE READ snapshot for
``--hold-minutes`` in the middle of the run, as a report would: it has read a table of its own
(``--hold-reads-outbox``: the outbox, which also keeps partitioned mode's rotation from
detaching a partition until it ends).

Every ``--sample-seconds`` one line per mode:
- rows written and sent per second (sent: the worker's relayer_messages_sent counter), and the
  backlog (written - sent);
- head read: a separate session runs the worker's own head probe (relayer.store.RelayStore.probe's
  statement) under EXPLAIN ANALYZE for each of --read-lanes lanes (8) spread over the store: the
  median and slowest execution time in the server (ms), and the median of the buffers it touched;
- the outbox's heap and indexes (summed over pg_partition_tree: its partitions when it has
  some) and every table of the store's schema with indexes and TOAST; dead tuples of the outbox
  (pg_stat_user_tables, summed over its partitions); autovacuum runs and checkpoints since the
  last line;
- per row sent in the interval: WAL bytes (pg_current_wal_lsn differences), PostgreSQL CPU
  (user + system from /proc of the postmaster and every live child, plus the children it
  reaped: autovacuum workers and ended sessions; the soak's own monitoring sessions left out;
  the writers' sessions are included and also shown apart) and the worker's CPU.
``--lock-sample`` looks at pg_locks every 10 ms and adds the longest lock wait of a writer or
worker session seen in the interval (and over the run). ``--find-max``: no held snapshot; the
rate starts at --rate and grows by --step-factor every --step-samples samples until the backlog
grows by more than half a second of writes in two samples in a row at one rate; the last rate
before it is the mode's highest sustained rate (at least that, when the writers fell short
rather than the relay). ``--json`` writes every sample; ``--plot``
renders sent rows/s, head read and store size over time per mode as SVG. Prints figures;
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import sql

from bench.common import machine, server_version
from bench.efficiency_processes import WorkerProcess, write_config
from bench.relay import LANES, applied, make_store
from bench.soak_figures import Monitor, Reading, Sample, line, optional, sample_of
from bench.soak_load import (
    POSTGRES_BIN,
    HeldSnapshot,
    LockSampler,
    Writers,
    private_postgres,
)
from bench.soak_plot import render
from relayer.embedded import EmbeddedPostgres, free_port
from relayer.errors import ConfigurationError
from relayer.settings import StoreSettings, load_settings

STORE = "soak"
# The table the held snapshot's transaction reads (an application's, not relayer's).
REPORT_TABLE = "soak_report"
MAX_ROWS = 10_000_000
MAX_MINUTES = 30.0


@dataclass
class Schedule:
    """When a mode's run samples, holds its snapshot and ends (seconds from its start)."""

    seconds: float
    sample: float
    hold: tuple[float, float] | None

    def holds(self, elapsed: float) -> bool:
        return self.hold is not None and self.hold[0] <= elapsed < self.hold[1]


def schedule(arguments: argparse.Namespace) -> Schedule:
    minutes = arguments.minutes
    if minutes is None:
        minutes = min(MAX_MINUTES, MAX_ROWS / arguments.rate / 60)
    seconds = minutes * 60
    hold = min(arguments.hold_minutes * 60, seconds)
    middle = (seconds - hold) / 2
    window = (middle, middle + hold) if hold > 0 and not arguments.find_max else None
    return Schedule(seconds, arguments.sample_seconds, window)


class Sampler:
    """Takes a sample every interval: compares the counters with the previous reading."""

    def __init__(self, monitor: Monitor, mode: str) -> None:
        self.monitor = monitor
        self.mode = mode
        self.samples: list[Sample] = []
        self.started = 0.0
        self.previous: Reading | None = None

    async def begin(self) -> None:
        self.previous = await self.monitor.read()
        self.started = self.previous.at

    async def take(self, target: float) -> Sample:
        assert self.previous is not None
        reading = await self.monitor.read()  # the counters first, at the interval's end
        reads = await self.monitor.head_reads()
        sample = sample_of(self.previous, reading, self.started, target, reads)
        sample.held = self.monitor.held.held
        if self.monitor.locks is not None:
            wait = self.monitor.locks.take()
            sample.lock_wait_ms = wait.seconds * 1000 if wait else 0.0
            sample.lock_waiter = f"{wait.who}, {wait.lock}" if wait else None
        self.previous = reading
        self.samples.append(sample)
        print(line(self.mode, sample), flush=True)
        return sample


async def wait_until(moment: float, monitor: Monitor, worker: WorkerProcess) -> None:
    """Sleep until ``moment`` (perf_counter), raising if the worker or a writer exits."""
    while (left := moment - time.perf_counter()) > 0:
        worker.check()
        monitor.writers.check()
        await asyncio.sleep(min(left, 0.5))


async def soak(sampler: Sampler, plan: Schedule, worker: WorkerProcess, rate: float) -> None:
    """The fixed rate for the whole run, the snapshot held in its middle: over every sample
    interval whose middle falls in the hold window (the hold is a whole number of intervals)."""
    monitor = sampler.monitor
    await sampler.begin()
    count = max(1, round(plan.seconds / plan.sample))
    for number in range(1, count + 1):
        middle = (number - 0.5) * plan.seconds / count
        elapsed = (time.perf_counter() - sampler.started) / 60
        if plan.holds(middle) and not monitor.held.held:
            await monitor.held.take()
            print(f"{sampler.mode}: a snapshot is held from minute {elapsed:.2f}", flush=True)
        elif monitor.held.held and not plan.holds(middle):
            await monitor.held.release()
            print(f"{sampler.mode}: the snapshot is released at minute {elapsed:.2f}", flush=True)
        await wait_until(sampler.started + number * plan.seconds / count, monitor, worker)
        await sampler.take(rate)
    await monitor.held.release()


async def find_max(
    sampler: Sampler, plan: Schedule, worker: WorkerProcess, arguments: argparse.Namespace
) -> tuple[float | None, bool, str]:
    """Step the rate up until the backlog grows in two samples in a row at one rate: the last
    rate before, whether the relay fell behind (else the writers or the time were the limit and
    the rate is a lower bound), and why it ended."""
    rate = arguments.rate
    sustained: float | None = None
    await sampler.begin()
    while time.perf_counter() - sampler.started < plan.seconds:
        sampler.monitor.writers.set_rate(rate)
        backlog = sampler.samples[-1].backlog if sampler.samples else 0
        grew = 0
        written: list[float] = []
        for _ in range(arguments.step_samples):
            await wait_until(time.perf_counter() + plan.sample, sampler.monitor, worker)
            sample = await sampler.take(rate)
            written.append(sample.written_per_s)
            grew = grew + 1 if sample.backlog - backlog > rate / 2 else 0
            backlog = sample.backlog
            if grew >= 2:
                return sustained, True, f"the backlog grew in two samples in a row at {rate:,.0f}/s"
        if statistics.median(written) < 0.95 * rate:
            reached = statistics.median(written)
            why = (
                f"the writers reached only {reached:,.0f} rows/s of {rate:,.0f}; the relay kept up"
            )
            return sustained, False, why
        sustained = rate
        rate *= arguments.step_factor
    return sustained, False, f"--minutes ran out at {rate:,.0f}/s"


def storage_settings(mode: str, dsn: str, span: str | None = None) -> dict[str, Any] | None:
    """The store settings of ``mode`` (``span``: partitioned mode's partition_span, else its
    default); None, said in one line, if the store refuses it. Without the ``storage`` setting
    (a relayer before it), a store deletes: "delete" needs none."""
    extra = {"partition_span": span} if span and mode == "partitioned" else {}
    try:
        make_store(dsn, STORE, name=STORE, storage=mode, **extra)
    except ConfigurationError as exc:
        if mode == "delete":
            return {}
        print(f"{mode}: skipped: the store refuses storage = {mode!r}: {exc}")
        return None
    return {"storage": mode, **extra}


@contextlib.asynccontextmanager
async def relaying(
    server: EmbeddedPostgres, settings: dict[str, Any], folder: str
) -> AsyncIterator[tuple[StoreSettings, str, WorkerProcess, int]]:
    """The store, created, and ``relayer run`` serving it to the memory transport."""
    async with await psycopg.AsyncConnection.connect(server.dsn, autocommit=True) as conn:
        await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(STORE)))
    draft = make_store(server.dsn, STORE, name=STORE, lanes=LANES, **settings)
    options = [f'{name} = "{setting}"' for name, setting in settings.items()]
    config = write_config(draft, {"type": "memory"}, folder, options)
    store = await applied(load_settings(config).store(STORE))
    port = free_port()
    command = [sys.executable, "-m", "relayer", "--config", config, "run", STORE]
    command += ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"]
    async with WorkerProcess(command, folder) as worker:
        yield store, config, worker, port


async def run_mode(mode: str, arguments: argparse.Namespace) -> dict[str, Any] | None:
    """One mode on a cluster of its own: its samples, and its highest rate under --find-max."""
    plan = schedule(arguments)
    with private_postgres(Path(arguments.postgres_bin)) as server:
        settings = storage_settings(mode, server.dsn, arguments.partition_span)
        if settings is None:
            return None
        print(f"{mode}: {server_version(server.dsn)}, autovacuum on, on its own port")
        with tempfile.TemporaryDirectory(prefix="soak-") as folder:
            async with relaying(server, settings, folder) as (store, config, worker, port):
                return await measure(mode, arguments, plan, server, store, config, worker, port)
    return None


async def measure(
    mode: str,
    arguments: argparse.Namespace,
    plan: Schedule,
    server: EmbeddedPostgres,
    store: StoreSettings,
    config: str,
    worker: WorkerProcess,
    port: int,
) -> dict[str, Any]:
    writers = Writers(config, STORE, arguments.writers, arguments.batch, arguments.rate)
    locks = LockSampler(server.dsn) if arguments.lock_sample else None
    if arguments.hold_reads_outbox:
        table = sql.Identifier(store.db_schema, store.names.table("outbox"))
    else:
        table = sql.Identifier("public", REPORT_TABLE)
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (x int)").format(table))
    held = HeldSnapshot(server.dsn, table)
    async with await psycopg.AsyncConnection.connect(
        server.dsn, autocommit=True, application_name="soak-monitor"
    ) as conn:
        monitor = Monitor(server, store, conn, worker.pid, port, writers, locks, held)
        monitor.read_lanes = min(arguments.read_lanes, store.lanes)
        monitor.monitors.append(conn.info.backend_pid)
        sampler = Sampler(monitor, mode)
        writers.start()
        try:
            await writers.ready(worker.check)
            if locks is not None:
                await locks.start()
            result: dict[str, Any] = {"mode": mode, "settings": settings_line(store, mode)}
            if arguments.find_max:
                sustained, found, why = await find_max(sampler, plan, worker, arguments)
                result.update(kind="find-max", max_rate=sustained, max_found=found, ended=why)
                bound = "" if found else "at least "
                rate = optional(sustained, ",.0f")
                print(f"{mode}: highest sustained rate {bound}{rate} rows/s ({why})", flush=True)
            else:
                await soak(sampler, plan, worker, arguments.rate)
                result.update(kind="soak")
            if locks is not None and locks.longest is not None:
                result["longest_lock_wait"] = asdict(locks.longest)
            result["samples"] = [asdict(sample) for sample in sampler.samples]
            return result
        finally:
            writers.stop()
            if locks is not None:
                await locks.stop()
            await held.release()


def settings_line(store: StoreSettings, mode: str) -> str:
    return f"storage {mode}, {store.lanes} lanes, notify {store.notify}, batch {store.batch_size}"


def summary(result: dict[str, Any]) -> str:
    samples = result["samples"]
    if not samples:
        return f"{result['mode']}: no sample"
    sent = [sample["sent_per_s"] for sample in samples]
    reads = [sample["read_ms_p50"] for sample in samples]
    sizes = [sample["store_mb"] for sample in samples]
    backlog = max(sample["backlog"] for sample in samples)
    text = (
        f"{result['mode']}: sent {min(sent):,.0f}-{max(sent):,.0f} rows/s, backlog up to "
        f"{backlog:,}, head read {min(reads):.2f}-{max(reads):.2f} ms, store "
        f"{sizes[0]:,.0f} MB at the first sample, {max(sizes):,.0f} MB at most, "
        f"{sizes[-1]:,.0f} MB at the end"
    )
    wait = result.get("longest_lock_wait")
    if wait:
        text += (
            f"; longest lock wait {wait['seconds'] * 1000:.0f} ms ({wait['who']}, {wait['lock']})"
        )
    return text


async def main_async(arguments: argparse.Namespace) -> dict[str, Any]:
    plan = schedule(arguments)
    hold = "never"
    if plan.hold is not None:
        hold = f"from minute {plan.hold[0] / 60:.2f} to {plan.hold[1] / 60:.2f}"
    print(
        f"machine: {machine()}; {arguments.rate:,.0f} rows/s by {arguments.writers} writer "
        f"process(es), {arguments.batch} rows a transaction, {plan.seconds / 60:.2f} minutes a "
        f"mode, a sample every {plan.sample:g} s, snapshot held {hold}",
        flush=True,
    )
    results: dict[str, Any] = {"machine": machine(), "command": sys.argv, "runs": []}
    for _ in range(arguments.rounds):
        for mode in arguments.modes:
            result = await run_mode(mode, arguments)
            if result is not None:
                results["runs"].append(result)
                print(summary(result), flush=True)
                save(results, arguments)  # an interrupted run keeps the modes it finished
    return results


def save(results: dict[str, Any], arguments: argparse.Namespace) -> None:
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(results, indent=1) + "\n")
    if arguments.plot:
        Path(arguments.plot).write_text(render(results))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--modes", default="delete,partitioned", help="storage modes, comma-separated")
    add("--rate", type=float, default=15_000, help="rows/s (--find-max: the first rate)")
    add("--minutes", type=float, help="a mode's length (default: 10 M rows or 30 minutes)")
    add("--hold-minutes", type=float, default=10.0)
    add("--sample-seconds", type=float, default=60.0)
    add("--batch", type=int, default=50, help="rows a transaction")
    add("--writers", type=int, default=4, help="writer processes")
    add("--rounds", type=int, default=1, help="times the modes alternate")
    add("--find-max", action="store_true")
    add("--step-factor", type=float, default=1.25)
    add("--step-samples", type=int, default=3)
    add("--lock-sample", action="store_true", help="pg_locks every 10 ms")
    add("--read-lanes", type=int, default=8, help="lanes whose head read is timed each sample")
    add("--json", help="write the samples to this file")
    add("--plot", help="render an SVG of the samples to this file")
    add("--postgres-bin", default=str(POSTGRES_BIN))
    add(
        "--hold-reads-outbox",
        action="store_true",
        help="the held snapshot's transaction reads the outbox (default: a table of its own, as "
        "a report does); it then also keeps partitioned mode's rotation from detaching",
    )
    add(
        "--partition-span",
        help="partitioned mode's partition_span (default: the store's, 10m); a short span "
        "rotates partitions within a short run",
    )
    arguments = parser.parse_args(argv)
    arguments.modes = [mode.strip() for mode in arguments.modes.split(",") if mode.strip()]
    positive = (
        "rate",
        "sample_seconds",
        "batch",
        "writers",
        "rounds",
        "step_samples",
        "read_lanes",
    )
    for name in positive:
        if getattr(arguments, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be above 0")
    if (arguments.minutes is not None and arguments.minutes <= 0) or arguments.step_factor <= 1:
        parser.error("--minutes must be above 0 and --step-factor above 1")
    if not arguments.modes:
        parser.error("--modes names no mode")
    return arguments


def main(argv: list[str] | None = None) -> None:
    arguments = parse(argv)

    def stop(_signal: int, _frame: object) -> None:
        raise KeyboardInterrupt  # the same clean-up as Ctrl-C

    signal.signal(signal.SIGTERM, stop)
    try:
        asyncio.run(main_async(arguments))
    except KeyboardInterrupt:
        print("interrupted: the worker, the writers and the private PostgreSQL are stopped")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
