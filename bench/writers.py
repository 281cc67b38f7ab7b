"""Writers benchmark: what the relay costs the application's commits, with many writers.

    python bench/writers.py [--dsn DSN] [--writers 1,8,32,64] [--seconds 8] [--rounds 2]

Each writer commits one outbox row per transaction (``Outbox.write`` on a synchronous psycopg
connection, a 200-byte body, a key of its own) for ``--seconds``, in each wake-up mode (the
store's ``notify``: after_commit, in_transaction, off); the same rows inserted by a bare psycopg
``execute`` into a plain table of the outbox's shape (``LIKE`` the outbox ``INCLUDING ALL``: the
same columns, PRIMARY KEY (lane, id)), with no relayer in the transaction, are the reference.
Every contender runs at one concurrency before the next concurrency, in an order that turns
round by round; both tables are emptied, and a CHECKPOINT taken, before every cell. No worker
runs: this measures commits only.

Writers are processes, one connection each. In after_commit mode each writer process also has
the waker's connection (relayer.writer.waker), so when the server's max_connections cannot hold
both for every writer, writers share processes (threads of one process, a connection each) so
that writers plus wakers fit; every contender then runs in the same layout, which is printed.

Prints, per cell: commits/s (median of the rounds, and their range), its ratio to the plain
table's in the same round, the transaction's latency (the insert and the COMMIT) and the
COMMIT's alone, p50 and p99 over every round, and in after_commit mode how many notifying
transactions the wakers sent (NotifyConnection.sent) per commit. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any
from uuid import UUID

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from bench.common import machine, postgres, scratch_schema, server_version
from relayer import Outbox
from relayer.errors import RelayerError
from relayer.operations import schema
from relayer.settings import StoreSettings, store_settings

BODY = b"x" * 200
LANES = 64
MODES = ("after_commit", "in_transaction", "off")
PLAIN = "plain"
CONTENDERS = (PLAIN, *MODES)
WARM_UP = 3  # transactions per writer before a cell's window (connection, lane-count check)
SPARE_CONNECTIONS = 10  # left to the other users of the server
ATTEMPTS = 3  # a cell whose writers cannot all connect is tried again ...
RETRY_AFTER = 5.0  # ... this many seconds later
COLUMNS = "id, lane, ordering_key, transport, destination, body, headers, deliver_at"

Write = Callable[[psycopg.Connection[Any], str], None]


@dataclass
class Cell:
    """What one contender did at one concurrency in one round."""

    commits: int = 0
    seconds: float = 0.0
    transactions: list[float] = field(default_factory=list)  # insert + COMMIT, seconds
    commit_times: list[float] = field(default_factory=list)  # the COMMIT alone
    wakes: int = 0  # notifying transactions the wakers sent (after_commit)
    wake_failures: int = 0  # wake-ups the wakers could not send
    error: str = ""

    @property
    def rate(self) -> float:
        return self.commits / self.seconds if self.seconds else 0.0

    def merge(self, other: Cell) -> None:
        self.commits += other.commits
        self.transactions += other.transactions
        self.commit_times += other.commit_times
        self.wakes += other.wakes
        self.wake_failures += other.wake_failures
        self.error = self.error or other.error


# -- the writer processes --------------------------------------------------------------------


def plain_id() -> UUID:
    """A time-ordered id like the outbox's (UUIDv7 layout), made without relayer."""
    millis = time.time_ns() // 1_000_000
    return UUID(int=millis << 80 | 0x7 << 76 | 0b10 << 62 | int.from_bytes(os.urandom(8)) >> 2)


def writes(stores: dict[str, StoreSettings], plain: sql.Composed) -> dict[str, Write]:
    """Each contender's one-row write (the transaction is the caller's)."""
    outboxes = {mode: Outbox(store) for mode, store in stores.items()}
    no_headers = Jsonb({})

    def plain_write(conn: psycopg.Connection[Any], key: str) -> None:
        row = (plain_id(), hash(key) % LANES, key, None, "orders", BODY, no_headers, None)
        conn.execute(plain, row)

    def relayer_write(outbox: Outbox) -> Write:
        def write(conn: psycopg.Connection[Any], key: str) -> None:
            outbox.write(conn, destination="orders", body=BODY, key=key)

        return write

    return {PLAIN: plain_write, **{mode: relayer_write(box) for mode, box in outboxes.items()}}


def writer_loop(
    conn: psycopg.Connection[Any], write: Write, name: str, window: tuple[float, float]
) -> Cell:
    """Commit one row per transaction until the window closes; the commits completed in it."""
    start, end = window
    cell = Cell(seconds=end - start)
    number = 0
    time.sleep(max(0.0, start - time.monotonic()))
    while True:
        number += 1
        began = time.monotonic()
        write(conn, f"{name}-{number}")
        committing = time.monotonic()
        conn.commit()
        done = time.monotonic()
        if done > end:
            return cell
        if done >= start:
            cell.commits += 1
            cell.transactions.append(done - began)
            cell.commit_times.append(done - committing)


class WriterProcess:
    """One writer process's state: its connections for the current cell, and its waker (the
    one every after_commit write of the process hands its lanes to), whose failures it counts."""

    def __init__(self, dsn: str, stores: dict[str, StoreSettings], plain: sql.Composed) -> None:
        self.dsn = dsn
        self.contenders = writes(stores, plain)
        self.waker = Outbox(stores["after_commit"]).waker
        self.failures = 0  # wake-ups the waker could not send (counted here, not logged)
        logging.getLogger("relayer.writer.waker").setLevel(logging.CRITICAL)
        notify = self.waker.notifier.notify

        def counted(wakes: Any) -> None:
            try:
                notify(wakes)
            except RelayerError:
                self.failures += 1
                raise

        self.waker.notifier.notify = counted  # type: ignore[method-assign]
        self.conns: list[psycopg.Connection[Any]] = []
        self.write = self.contenders[PLAIN]

    def prepare(self, contender: str, count: int) -> str | None:
        """Connect and warm up ``count`` writers (the waker too): None, or why it failed."""
        self.write = self.contenders[contender]
        failures = self.failures
        try:
            self.conns = [psycopg.connect(self.dsn) for _ in range(count)]
            for index, conn in enumerate(self.conns):
                for warm in range(WARM_UP):
                    self.write(conn, f"warm-{os.getpid()}-{index}-{warm}")
                    conn.commit()
        except psycopg.Error as exc:
            self.close()
            return " ".join(f"{type(exc).__name__}: {exc}".split())
        self.waker.flush()
        if self.failures > failures:
            self.close()
            return "the waker could not send its wake-ups (connection refused?)"
        return None

    def run(self, window: tuple[float, float]) -> Cell:
        sent, failures = self.waker.notifier.sent, self.failures
        cell = run_window(self.conns, self.write, window)
        self.waker.flush()
        cell.wakes = self.waker.notifier.sent - sent
        cell.wake_failures = self.failures - failures
        self.close()
        return cell

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.conns = []
        self.waker.notifier.close()  # its connection slot is free for the next cell


def serve(pipe: Pipe, dsn: str, stores: dict[str, StoreSettings], plain: sql.Composed) -> None:
    """A writer process: prepare connections, run a window, report; until told to stop."""
    process = WriterProcess(dsn, stores, plain)
    while True:
        command, argument = pipe.recv()
        if command == "stop":
            return
        if command == "prepare":
            pipe.send(process.prepare(*argument))
        elif command == "go":
            pipe.send(process.run(argument))
        elif command == "skip":
            process.close()
            pipe.send(None)


def run_window(
    conns: list[psycopg.Connection[Any]], write: Write, window: tuple[float, float]
) -> Cell:
    """Every connection of this process writing in its own thread through the window."""
    results: list[Cell] = [Cell() for _ in conns]

    def run(index: int) -> None:
        results[index] = writer_loop(conns[index], write, f"w{os.getpid()}-{index}", window)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(conns))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = Cell(seconds=window[1] - window[0])
    for result in results:
        total.merge(result)
    return total


# -- the conductor -----------------------------------------------------------------------------


class Writers:
    """The writer processes (forked once) and the scratch tables they write to."""

    def __init__(self, dsn: str, stores: dict[str, StoreSettings], processes: int) -> None:
        self.dsn = dsn
        store = stores["off"]
        outbox = sql.Identifier(store.db_schema, store.names.table("outbox"))
        self.plain = sql.Identifier(store.db_schema, "plain_outbox")
        self.tables = sql.SQL(", ").join([outbox, self.plain])
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(self.plain, outbox)
            )
        insert = sql.SQL(f"INSERT INTO {{}} ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")
        context = multiprocessing.get_context("fork")
        self.pipes: list[Pipe] = []
        self.processes = []
        for _ in range(processes):
            parent, child = context.Pipe()
            process = context.Process(
                target=serve, args=(child, dsn, stores, insert.format(self.plain)), daemon=True
            )
            process.start()
            self.pipes.append(parent)
            self.processes.append(process)

    def cell(self, contender: str, layout: list[int], seconds: float) -> Cell:
        """One window of ``contender`` with ``layout[i]`` writers in process i; the server's
        other users may hold the connections it needs for a while: it tries again."""
        error = ""
        for _ in range(ATTEMPTS):
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("TRUNCATE {}").format(self.tables))
                conn.execute("CHECKPOINT")
            pipes = self.pipes[: len(layout)]
            for pipe, count in zip(pipes, layout, strict=True):
                pipe.send(("prepare", (contender, count)))
            errors = [error for error in (pipe.recv() for pipe in pipes) if error]
            if not errors:
                return self.window(pipes, seconds)
            error = errors[0]
            for pipe in pipes:
                pipe.send(("skip", None))
                pipe.recv()
            time.sleep(RETRY_AFTER)
        return Cell(error=error)

    def window(self, pipes: list[Pipe], seconds: float) -> Cell:
        start = time.monotonic() + 0.5
        total = Cell(seconds=seconds)
        for pipe in pipes:
            pipe.send(("go", (start, start + seconds)))
        for pipe in pipes:
            total.merge(pipe.recv())
        return total

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(("stop", None))
        for process in self.processes:
            process.join(timeout=30)


def free_connections(dsn: str) -> int:
    """Connections the server can still take, less a margin for its other users."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT pg_catalog.current_setting('max_connections')::int"
            " - pg_catalog.current_setting('superuser_reserved_connections')::int"
            " - (SELECT pg_catalog.count(*)::int FROM pg_catalog.pg_stat_activity"
            "    WHERE backend_type = 'client backend')"
        ).fetchone()
    assert row is not None
    return int(row[0]) - SPARE_CONNECTIONS


def layout(writers: int, free: int) -> list[int]:
    """Writers per process: one each when writers and their wakers fit in ``free`` connections,
    else as few processes as needed for writers + one waker per process to fit."""
    processes = min(writers, free - writers)
    if processes < 1:
        raise SystemExit(f"--writers {writers}: the server has {free} connections to spare")
    return [writers // processes + (index < writers % processes) for index in range(processes)]


# -- the report --------------------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def spread(values: list[float], unit: Callable[[float], str]) -> str:
    """The median, and the range when there are several rounds."""
    text = unit(statistics.median(values))
    return f"{text} ({unit(min(values))}-{unit(max(values))})" if len(values) > 1 else text


def row(writers: int, shape: str, contender: str, rounds: list[Cell], plain: list[Cell]) -> str:
    """One line of the table; rounds that could not run are left out, and said."""
    ran = [cell for cell in rounds if not cell.error]
    failed = [cell.error for cell in rounds if cell.error]
    note = f" ({len(failed)} of {len(rounds)} rounds not run: {failed[0]})" if failed else ""
    if not ran:
        return f"| {writers} | {shape} | {contender} | not run{note} | | | | |"
    ratios = [
        cell.rate / base.rate
        for cell, base in zip(rounds, plain, strict=True)
        if not cell.error and not base.error and base.rate
    ]
    pooled = Cell()
    for cell in ran:
        pooled.merge(cell)

    def milliseconds(values: list[float]) -> str:
        return f"{percentile(values, 0.5) * 1e3:.2f} / {percentile(values, 0.99) * 1e3:.2f}"

    wakes = "-"
    if contender == "after_commit":
        wakes = f"{pooled.wakes:,} ({pooled.wakes / max(1, pooled.commits):.2f} a commit)"
        if pooled.wake_failures:
            wakes += f"; {pooled.wake_failures:,} failed"
    rates = spread([cell.rate for cell in ran], "{:,.0f}".format)
    return (
        f"| {writers} | {shape} | {contender} | {rates}{note}"
        f" | {spread(ratios, '{:.2f}x'.format) if ratios else '-'}"
        f" | {milliseconds(pooled.transactions)} | {milliseconds(pooled.commit_times)}"
        f" | {wakes} |"
    )


def shape_of(processes: list[int]) -> str:
    if max(processes) == 1:
        return f"{len(processes)} process{'es' if len(processes) > 1 else ''}"
    return f"{len(processes)} processes, {min(processes)}-{max(processes)} writers each"


# -- main --------------------------------------------------------------------------------------


def stores_for(dsn: str, schema_name: str) -> dict[str, StoreSettings]:
    """One store per wake-up mode, all on the same outbox table (the schema applied once)."""
    stores = {
        mode: store_settings(
            name="bench", dsn=dsn, schema=schema_name, table_prefix="w_", lanes=LANES, notify=mode
        )
        for mode in MODES
    }

    async def apply() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await schema.apply(conn, stores["off"])

    asyncio.run(apply())
    return stores


def measure(dsn: str, schema_name: str, arguments: argparse.Namespace) -> list[str]:
    concurrencies = [int(part) for part in arguments.writers.split(",")]
    free = free_connections(dsn)
    layouts = {writers: layout(writers, free) for writers in concurrencies}
    writers = Writers(dsn, stores_for(dsn, schema_name), max(map(len, layouts.values())))
    cells: dict[tuple[int, str], list[Cell]] = {}
    try:
        for round_number in range(arguments.rounds):
            for count in concurrencies:
                turn = round_number % len(CONTENDERS)
                for contender in CONTENDERS[turn:] + CONTENDERS[:turn]:
                    cell = writers.cell(contender, layouts[count], arguments.seconds)
                    cells.setdefault((count, contender), []).append(cell)
                    print(
                        f"round {round_number + 1}, {count} writers, {contender}: "
                        f"{cell.rate:,.0f} commits/s {cell.error}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        writers.close()
    lines = [
        "| writers | processes | contender | commits/s | vs plain | transaction p50 / p99 ms "
        "| COMMIT p50 / p99 ms | wake-ups sent (after the commit) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for count in concurrencies:
        for contender in CONTENDERS:
            lines.append(
                row(
                    count,
                    shape_of(layouts[count]),
                    contender,
                    cells[(count, contender)],
                    cells[(count, PLAIN)],
                )
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--writers", default="1,8,32,64", help="concurrencies, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0, help="each cell's window")
    parser.add_argument("--rounds", type=int, default=2)
    arguments = parser.parse_args()
    with postgres(arguments.dsn) as dsn, scratch_schema(dsn, "writers") as schema_name:
        print(f"machine: {machine()}; {server_version(dsn)}")
        load = " ".join(f"{value:.1f}" for value in os.getloadavg())
        print(f"load average at the start: {load}")
        started = time.monotonic()
        lines = measure(dsn, schema_name, arguments)
        load = " ".join(f"{value:.1f}" for value in os.getloadavg())
        print(f"load average at the end: {load}; {time.monotonic() - started:.0f} s")
        print(
            f"{arguments.rounds} rounds of {arguments.seconds:g} s a cell; one row a "
            f"transaction, {len(BODY)}-byte body, a key each; no worker running"
        )
        print("\n".join(lines))


if __name__ == "__main__":
    main()
