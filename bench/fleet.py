"""Fleet: many stores from one template served by a few workers (issue 16's benchmark).

    python bench/fleet.py [--stores 200] [--rows 1000] [--workers 2] [--max-connections 20]

A fresh database gets ``--stores`` stores, a schema each, listed in a discovery file with
weights 1, 2 and 4 (by thirds), each holding a backlog of ``--rows`` rows (``--rows-by-weight``:
``--rows`` times its weight, so that every store stays backlogged nearly to the end; the first store
``--big-rows`` instead, when given: a backlog far larger than the others'). ``--workers``
processes run ``relayer run --template tenants`` with ``worker.max_connections`` and the memory
transport (so that the figures are the relay's, not a broker's). It prints:

- the join time: the workers start together, and every store has a member (and every worker
  as one) so many seconds after they were launched, and after the last one logged "serving"
  (with the queues paused; ``--join-only``: a cold start, rows sent as stores join);
- the drain time, and how many rows a second that is;
- the connections each worker held, at most and on average (its backends in pg_stat_activity,
  found by the worker's own socket ports), against the budget;
- each store's share of the rows sent (what the Weighted dispatch apportions) and of lane
  scans while every store still had a backlog, against its weight's share (per weight class,
  how many stores are within 5%, and the worst store);
- with ``--big-rows``: when the other stores were drained and how much of the big one was left;
- the CPU of each worker and of its PostgreSQL backends while the stores sit idle, as a
  percentage of one core.

It prints; it asserts nothing. CPU is read from /proc (Linux only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import sql

from bench.common import machine, postgres, server_version
from bench.cpu import PROC, Meter, process_seconds
from bench.efficiency_processes import WorkerProcess
from relayer import Outbox, OutboxMessage
from relayer.dispatch.control import QueueControl
from relayer.embedded import free_port
from relayer.operations.schema import apply
from relayer.settings import StoreSettings, store_settings

TABLE_PREFIX = "outbox_"
KEYS = 50
WEIGHTS = (1, 2, 4)
SAMPLE_SECONDS = 1.0
JOIN_POLL = 0.1  # seconds between two looks at the stores' members while they join


@dataclass
class Tenant:
    name: str
    schema: str
    weight: int
    rows: int

    def settings(self, dsn: str, lanes: int) -> StoreSettings:
        return store_settings(
            name=f"tenants.{self.name}",
            dsn=dsn,
            db_schema=self.schema,
            table_prefix=TABLE_PREFIX,
            lanes=lanes,
        )


@dataclass
class Sample:
    at: float
    deleted: dict[str, int]
    connections: list[int]
    # Lane scans the dispatch layer started per store (queue), summed over the workers.
    jobs: dict[str, float]


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)


# -- set-up ---------------------------------------------------------------------------------


@contextlib.contextmanager
def fresh_database(server: str) -> Iterator[str]:
    name = f"relayer_fleet_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(server, dbname=name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def tenants(count: int, rows: int, big_rows: int, *, by_weight: bool = False) -> list[Tenant]:
    found = []
    for number in range(count):
        weight = WEIGHTS[number * len(WEIGHTS) // count]
        backlog = big_rows if big_rows and number == 0 else rows * (weight if by_weight else 1)
        found.append(Tenant(f"t{number:03d}", f"t{number:03d}", weight, backlog))
    return found


async def prepare(dsn: str, fleet: Sequence[Tenant], lanes: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for tenant in fleet:
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(tenant.schema)))
            await apply(conn, tenant.settings(dsn, lanes))
    with psycopg.connect(dsn) as conn:
        for tenant in fleet:
            outbox = Outbox(tenant.settings(dsn, lanes))
            for start in range(0, tenant.rows, 5_000):
                count = min(5_000, tenant.rows - start)
                outbox.write_many(
                    conn,
                    [
                        OutboxMessage("events", b"x" * 100, key=f"key-{(start + i) % KEYS}")
                        for i in range(count)
                    ],
                )
                conn.commit()
        conn.execute("ANALYZE")
        conn.commit()


def write_config(folder: Path, dsn: str, fleet: Sequence[Tenant], args: argparse.Namespace) -> Path:
    listing = folder / "stores.toml"
    listing.write_text(
        "".join(
            f'[[stores]]\nname = "{t.name}"\nschema = "{t.schema}"\nweight = {t.weight}\n\n'
            for t in fleet
        )
    )
    config = folder / "relayer.toml"
    config.write_text(
        f"""
log_level = "INFO"

[worker]
pool_size = {args.pool_size}
{f"max_connections = {args.max_connections}" if args.max_connections else ""}

[templates.tenants]
dsn = "{dsn}"
lanes = {args.lanes}
batch_size = {args.batch_size}
table_prefix = "{TABLE_PREFIX}"
default_transport = "memory"
discover_interval = "60s"
notify = "{args.notify}"

[templates.tenants.discovery]
file = "{listing}"

[templates.tenants.transports.memory]
type = "memory"
"""
    )
    return config


# -- readings -------------------------------------------------------------------------------

JOBS = re.compile(r'^relayer_dispatch_jobs_total\{queue="tenants\.([^"]+)"\} (\S+)$', re.M)


def jobs_started(ports: Sequence[int]) -> dict[str, float]:
    """Each store's lane scans started so far, summed over the workers' metrics endpoints."""
    found: dict[str, float] = {}
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
            text = page.read().decode()
        for name, value in JOBS.findall(text):
            found[name] = found.get(name, 0.0) + float(value)
    return found


def local_ports(pid: int) -> set[int]:
    """The local TCP ports of ``pid``'s sockets (its connections to PostgreSQL among them)."""
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for entry in (PROC / str(pid) / "fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(entry)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (PROC / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


async def backends_of(conn: psycopg.AsyncConnection[Any], pid: int) -> list[int]:
    """The PostgreSQL backends serving ``pid``'s connections."""
    ports = list(local_ports(pid))
    if not ports:
        return []
    cursor = await conn.execute(
        "SELECT pid FROM pg_catalog.pg_stat_activity WHERE client_port = ANY(%s)", (ports,)
    )
    return [int(row[0]) for row in await cursor.fetchall()]


async def deleted(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    """Rows deleted from each tenant's outbox so far (the statistics collector's counter)."""
    cursor = await conn.execute(
        "SELECT schemaname, n_tup_del FROM pg_catalog.pg_stat_user_tables WHERE relname = %s",
        (f"{TABLE_PREFIX}outbox",),
    )
    return {str(schema): int(count) for schema, count in await cursor.fetchall()}


async def set_paused(dsn: str, fleet: Sequence[Tenant], lanes: int, paused: bool) -> None:
    """Pause (or resume) every store's queue, in one transaction: resumed, every store's
    backlog becomes claimable at the same moment."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for tenant in fleet:
            control = QueueControl(conn, tenant.settings(dsn, lanes).names)
            if paused:
                await control.pause(f"tenants.{tenant.name}", reason="bench", by="bench")
            else:
                await control.resume(f"tenants.{tenant.name}", reason="bench", by="bench")
        await conn.commit()


@dataclass
class Joins:
    """Seconds from the workers' launch until each worker logged "serving", until every store
    had a live member, and until every store had every worker as one."""

    serving: list[float] = field(default_factory=list)
    first: float | None = None
    every: float | None = None

    def describe(self) -> str:
        assert self.first is not None and self.every is not None
        started = max(self.serving, default=0.0)
        return (
            f"join: workers serving {', '.join(f'{s:.1f}' for s in self.serving)} s after "
            f"launch; every store had a member {self.first:.1f} s after launch "
            f"({self.first - started:.1f} s after the last worker served), every worker "
            f"{self.every:.1f} s ({self.every - started:.1f} s after)"
        )


async def watch_joins(
    dsn: str,
    fleet: Sequence[Tenant],
    workers: Sequence[WorkerProcess],
    joins: Joins,
    started: float,
    limit: float,
) -> None:
    """Fill ``joins`` in: poll every store's live members until every worker serves every
    store (RuntimeError after ``limit`` seconds)."""
    query = sql.SQL(" UNION ALL ").join(
        sql.SQL(
            "SELECT count(*) FROM {} WHERE lane IS NULL AND expires_at >= pg_catalog.now()"
        ).format(sql.Identifier(t.schema, f"{TABLE_PREFIX}leases"))
        for t in fleet
    )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while time.perf_counter() - started < limit:
            for worker in workers:
                if worker.process is not None:
                    worker.check()
            cursor = await conn.execute(query)
            counts = [int(row[0]) for row in await cursor.fetchall()]
            at = time.perf_counter() - started
            if joins.first is None and all(counts):
                joins.first = at
            if all(count >= len(workers) for count in counts):
                joins.every = at
                return
            await asyncio.sleep(JOIN_POLL)
    raise RuntimeError(f"the stores were not all joined by every worker within {limit:g} s")


async def launch(
    dsn: str,
    fleet: Sequence[Tenant],
    workers: Sequence[WorkerProcess],
    stack: contextlib.AsyncExitStack,
    limit: float,
) -> Joins:
    """Start every worker at once and time the joins (:class:`Joins`)."""
    joins = Joins([0.0] * len(workers))
    started = time.perf_counter()
    watching = asyncio.create_task(watch_joins(dsn, fleet, workers, joins, started, limit))

    async def start(index: int) -> None:
        await stack.enter_async_context(workers[index])
        joins.serving[index] = time.perf_counter() - started

    try:
        await asyncio.gather(*(start(index) for index in range(len(workers))))
        await watching
    finally:
        watching.cancel()
    return joins


async def remaining(dsn: str, fleet: Sequence[Tenant]) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        found = {}
        for tenant in fleet:
            table = sql.Identifier(tenant.schema, f"{TABLE_PREFIX}outbox")
            cursor = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
            row = await cursor.fetchone()
            found[tenant.name] = int(row[0]) if row else 0
        return found


# -- the run --------------------------------------------------------------------------------


async def drain(
    dsn: str,
    fleet: Sequence[Tenant],
    workers: Sequence[WorkerProcess],
    ports: Sequence[int],
    limit: float,
) -> tuple[float, Run]:
    total = sum(t.rows for t in fleet)
    run = Run()
    started = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        baseline = await deleted(conn)
        while time.perf_counter() - started < limit:
            for worker in workers:
                worker.check()
            now = await deleted(conn)
            counts = {schema: now.get(schema, 0) - baseline.get(schema, 0) for schema in now}
            connections = [len(await backends_of(conn, w.pid)) for w in workers]
            jobs = await asyncio.to_thread(jobs_started, ports)
            at = time.perf_counter() - started
            run.samples.append(Sample(at, counts, connections, jobs))
            if sum(counts.values()) >= total:
                break
            await asyncio.sleep(SAMPLE_SECONDS)
    seconds = time.perf_counter() - started
    left = await remaining(dsn, fleet)
    if any(left.values()):
        print(f"not drained within {limit:g} s: {sum(left.values()):,} rows left")
    return seconds, run


def shares(fleet: Sequence[Tenant], run: Run) -> None:
    """Each store's share of service while every store had a backlog, against its weight's
    share: of the dispatch layer's lane scans, and of the rows (what Weighted apportions: a
    lane scan costs the rows its store sent)."""
    rows = {t.schema: t.rows for t in fleet}
    first, window = run.samples[0] if run.samples else None, None
    for sample in run.samples:
        if any(sample.deleted.get(schema, 0) >= count for schema, count in rows.items()):
            break
        window = sample
    if first is None or window is None or window is first:
        print("shares: no sample before the first store drained (raise --rows)")
        return
    total_weight = sum(t.weight for t in fleet)
    print(
        f"shares over the first {window.at:.1f} s, every store still backlogged "
        "(observed share / weight share):"
    )
    served = {t.name: window.jobs.get(t.name, 0.0) - first.jobs.get(t.name, 0.0) for t in fleet}
    sent = {t.name: float(window.deleted.get(t.schema, 0)) for t in fleet}
    for label, counts in (("lane scans", served), ("rows", sent)):
        total = sum(counts.values())
        if not total:
            print(f"  {label}: none in the window")
            continue
        ratios = {t.name: (counts[t.name] / total) / (t.weight / total_weight) for t in fleet}
        by_weight = []
        for weight in sorted({t.weight for t in fleet}):
            group = [counts[t.name] for t in fleet if t.weight == weight]
            share = sum(group) / total
            expected = weight * len(group) / total_weight
            by_weight.append(f"weight {weight}: {share / expected:.3f}")
        within = sum(1 for ratio in ratios.values() if abs(ratio - 1) <= 0.05)
        worst = max(ratios.items(), key=lambda item: abs(item[1] - 1))
        print(
            f"  {label} ({total:,.0f}): per weight class {', '.join(by_weight)}; stores within "
            f"5%: {within} of {len(ratios)}, worst {worst[0]} at {worst[1]:.3f}"
        )


def big_store(fleet: Sequence[Tenant], run: Run) -> None:
    big, others = fleet[0], fleet[1:]
    for sample in run.samples:
        if all(sample.deleted.get(t.schema, 0) >= t.rows for t in others):
            left = big.rows - sample.deleted.get(big.schema, 0)
            print(
                f"big store: the other {len(others)} stores drained in {sample.at:.1f} s while "
                f"{big.name} ({big.rows:,} rows) still had {left:,}"
            )
            return
    print("big store: the other stores were not drained before it")


def connections(run: Run, workers: int, budget: int) -> None:
    for index in range(workers):
        counts = [sample.connections[index] for sample in run.samples]
        print(
            f"worker {index}: connections at most {max(counts)}, on average "
            f"{statistics.mean(counts):.1f}, budget {budget}"
        )


async def idle(dsn: str, workers: Sequence[WorkerProcess], seconds: float, settle: float) -> None:
    await asyncio.sleep(settle)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:

        def finder(pid: int) -> Callable[[], Awaitable[list[int]]]:
            async def find() -> list[int]:
                return await backends_of(conn, pid)

            return find

        meter = Meter(
            {f"worker {i}": w.pid for i, w in enumerate(workers)},
            {f"backends {i}": finder(w.pid) for i, w in enumerate(workers)},
            interval=1.0,
        )
        before = [process_seconds(w.pid) for w in workers]
        await meter.start()
        await asyncio.sleep(seconds)
        window = await meter.stop()
        after = [process_seconds(w.pid) for w in workers]
    for index in range(len(workers)):
        own = (after[index] - before[index]) / window.seconds * 100
        backends = window.group(f"backends {index}") / window.seconds * 100
        print(
            f"idle worker {index}: {own:.2f}% of a core, its PostgreSQL backends "
            f"{backends:.2f}%, together {own + backends:.2f}% ({window.seconds:.0f} s)"
        )


async def main_async(args: argparse.Namespace) -> None:
    fleet = tenants(args.stores, args.rows, args.big_rows, by_weight=args.rows_by_weight)
    with postgres(args.dsn) as server, fresh_database(server) as dsn:
        print(f"{machine()}; {server_version(dsn)}")
        started = time.perf_counter()
        await prepare(dsn, fleet, args.lanes)
        total = sum(t.rows for t in fleet)
        print(
            f"{len(fleet)} stores ({args.lanes} lanes each, weights {'/'.join(map(str, WEIGHTS))}"
            f" by thirds), {total:,} rows written in {time.perf_counter() - started:.1f} s"
        )
        with tempfile.TemporaryDirectory(prefix="relayer-fleet-") as folder:
            config = write_config(Path(folder), dsn, fleet, args)
            workers = []
            ports = [free_port() for _ in range(args.workers)]
            for index in range(args.workers):
                log = Path(folder) / f"w{index}"
                log.mkdir()
                command = [
                    sys.executable, "-m", "relayer", "--config", str(config), "run",
                    "--template", "tenants", "--instance-id", f"fleet-{index}",
                    "--metrics-host", "127.0.0.1", "--metrics-port", str(ports[index]),
                    "--metrics-interval", "3600",
                ]  # fmt: skip
                workers.append(WorkerProcess(command, str(log)))
            # Paused until every worker serves every store: the drain and the shares start
            # together for all of them, not as stores join. With --join-only, a cold start:
            # the workers send the stores' rows as they join them.
            if not args.join_only:
                await set_paused(dsn, fleet, args.lanes, True)
            async with contextlib.AsyncExitStack() as stack:
                joins = await launch(dsn, fleet, workers, stack, args.timeout)
                print(joins.describe())
                if args.join_only:
                    return
                await set_paused(dsn, fleet, args.lanes, False)
                seconds, run = await drain(dsn, fleet, workers, ports, args.timeout)
                print(
                    f"drained {total:,} rows with {args.workers} workers in {seconds:.1f} s "
                    f"({total / seconds:,.0f} rows/s)"
                )
                connections(run, args.workers, args.max_connections)
                shares(fleet if not args.big_rows else fleet[1:], run)
                if args.big_rows:
                    big_store(fleet, run)
                await idle(dsn, workers, args.idle_seconds, args.idle_settle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="default: RELAYER_BENCH_DSN, else an embedded PostgreSQL")
    parser.add_argument("--stores", type=int, default=200)
    parser.add_argument("--rows", type=int, default=1_000, help="backlog of each store")
    parser.add_argument("--big-rows", type=int, default=0, help="the first store's backlog")
    parser.add_argument(
        "--rows-by-weight",
        action="store_true",
        help="each store's backlog is --rows x its weight: served by weight, every store drains "
        "at about the same time, so the shares are measured over (almost) the whole drain",
    )
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=500,
        help="the template's batch_size (smaller: more batches per store, a longer window "
        "in which every store has a backlog)",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool-size", type=int, default=8, help="worker.pool_size")
    parser.add_argument(
        "--max-connections", type=int, default=20, help="worker.max_connections (0: unset)"
    )
    parser.add_argument(
        "--notify",
        choices=("after_commit", "in_transaction", "off"),
        default="after_commit",
        help="the stores' wake-up mode (the idle figures depend on it)",
    )
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--idle-settle", type=float, default=90.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--join-only",
        action="store_true",
        help="a cold start: the stores' queues are not paused while the workers join them, and "
        "the run stops once every worker serves every store",
    )
    args = parser.parse_args()
    print(json.dumps({key: value for key, value in vars(args).items() if key != "dsn"}))
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
