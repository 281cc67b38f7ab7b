"""What bench/soak.py runs besides the worker: its private PostgreSQL, the writer processes, the
session that holds a snapshot, the pg_locks sampler and the figures read from the server."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from relayer.embedded import EmbeddedPostgres

POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")
KEYS = 10_000
WRITER_NAME = "soak-writer"
BODY = b"x" * 200


# -- the private server ----------------------------------------------------------------------


@contextlib.contextmanager
def private_postgres(bin_dir: Path) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of its own (initdb in a temporary directory, a free port on 127.0.0.1),
    autovacuum on and the installation's defaults otherwise; removed on exit, Ctrl-C too."""
    if not (bin_dir / "initdb").exists():
        raise SystemExit(f"--postgres-bin {bin_dir}: no initdb there; point it at PostgreSQL's bin")
    server = EmbeddedPostgres(bin_dir=bin_dir, settings={"autovacuum": "on"})
    try:
        yield server.start()
    finally:
        server.stop()


# -- writers ---------------------------------------------------------------------------------


def write_steadily(
    config: str,
    store_name: str,
    share: float,
    batch: int,
    rate: Synchronized[float],
    written: Synchronized[int],
    backend: Synchronized[int],
    stop: Any,
    number: int,
) -> None:
    """One writer process: commits ``batch`` rows a transaction (Outbox.write_many) at its
    ``share`` of ``rate`` rows/s until ``stop`` is set. Behind by more than a second, it
    forgets the rest instead of bursting (the rows written say what it reached)."""
    from relayer import Outbox, OutboxMessage
    from relayer.settings import load_settings

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops us
    store = load_settings(config).store(store_name)
    outbox = Outbox(store)
    with psycopg.connect(store.require_dsn(), application_name=WRITER_NAME) as conn:
        backend.value = conn.info.backend_pid
        due = time.perf_counter()
        count = 0
        while not stop.is_set():
            now = time.perf_counter()
            if due > now:
                time.sleep(min(due - now, 0.2))
                continue
            due = max(due, now - 1.0) + batch / max(rate.value * share, 1e-9)
            messages = [
                OutboxMessage("events", BODY, key=f"key-{(number * 7919 + count + i) % KEYS}")
                for i in range(batch)
            ]
            outbox.write_many(conn, messages)
            conn.commit()
            count += batch
            with written.get_lock():
                written.value += batch


@dataclass
class Writers:
    """``count`` writer processes sharing a rate that can change while they run."""

    config: str
    store_name: str
    count: int
    batch: int
    rate: float
    _context: Any = field(default_factory=lambda: multiprocessing.get_context("spawn"))
    processes: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._rate = self._context.Value("d", self.rate)
        self._written = self._context.Value("q", 0)
        self._stop = self._context.Event()
        self._backends = [self._context.Value("q", 0) for _ in range(self.count)]

    @property
    def written(self) -> int:
        return int(self._written.value)

    def backend_pids(self) -> list[int]:
        return [int(value.value) for value in self._backends if value.value]

    def set_rate(self, rate: float) -> None:
        self._rate.value = rate

    def start(self) -> None:
        for number in range(self.count):
            process = self._context.Process(
                target=write_steadily,
                args=(
                    self.config, self.store_name, 1 / self.count, self.batch, self._rate,
                    self._written, self._backends[number], self._stop, number,
                ),
                name=f"soak-writer-{number}",
                daemon=True,
            )  # fmt: skip
            process.start()
            self.processes.append(process)

    async def ready(self, check: Callable[[], None]) -> None:
        """Until every writer has connected (raising if one exits, or ``check`` raises)."""
        while len(self.backend_pids()) < self.count:
            self.check()
            check()
            await asyncio.sleep(0.05)

    def check(self) -> None:
        for process in self.processes:
            if process.exitcode is not None:
                raise RuntimeError(f"a writer exited ({process.exitcode}): see its output above")

    def stop(self) -> None:
        self._stop.set()
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.terminate()
                process.join(10)
        self.processes.clear()


# -- the held snapshot -----------------------------------------------------------------------


class HeldSnapshot:
    """A session in a REPEATABLE READ transaction that has read ``table``: vacuum cannot
    remove any row version deleted after it started until ``release``."""

    def __init__(self, dsn: str, table: sql.Composable) -> None:
        self.dsn = dsn
        self.table = table
        self.conn: psycopg.AsyncConnection[Any] | None = None

    @property
    def held(self) -> bool:
        return self.conn is not None

    async def take(self) -> None:
        self.conn = await psycopg.AsyncConnection.connect(self.dsn, application_name="soak-held")
        await self.conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        query = sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} LIMIT 1) AS one").format(self.table)
        await self.conn.execute(query)

    async def release(self) -> None:
        if self.conn is not None:
            await self.conn.rollback()
            await self.conn.close()
            self.conn = None


# -- pg_locks every 10 ms --------------------------------------------------------------------

LOCK_WAITS = """
SELECT l.pid, a.application_name, l.locktype, l.mode,
       extract(epoch FROM pg_catalog.clock_timestamp() - l.waitstart)::float8
FROM pg_catalog.pg_locks AS l
JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
WHERE NOT l.granted AND l.waitstart IS NOT NULL
  AND (a.application_name LIKE 'relayer:%%' OR a.application_name = %s)
  -- Rotation's own DETACH ... CONCURRENTLY waits for older transactions to end; nobody waits
  -- behind it (what it does to the others is what this samples).
  AND a.application_name <> 'relayer:rotate'
"""


@dataclass
class Wait:
    seconds: float
    who: str
    lock: str


class LockSampler:
    """Looks at pg_locks every ``interval`` seconds for writer or worker sessions waiting on a
    lock (not the rotation's own session); keeps the longest wait seen (waitstart to the last
    look that saw it waiting) since the last ``take``, and over the whole run."""

    def __init__(self, dsn: str, interval: float = 0.01) -> None:
        self.dsn = dsn
        self.interval = interval
        self.window: Wait | None = None
        self.longest: Wait | None = None
        self.looks = 0
        self.backend_pid = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, application_name="soak-locks"
        )
        self.backend_pid = conn.info.backend_pid
        self._task = asyncio.create_task(self._run(conn))

    async def _run(self, conn: psycopg.AsyncConnection[Any]) -> None:
        async with conn:
            while True:
                cursor = await conn.execute(LOCK_WAITS, (WRITER_NAME,))
                for _pid, who, locktype, mode, seconds in await cursor.fetchall():
                    wait = Wait(float(seconds), str(who), f"{locktype} {mode}")
                    if self.window is None or wait.seconds > self.window.seconds:
                        self.window = wait
                    if self.longest is None or wait.seconds > self.longest.seconds:
                        self.longest = wait
                self.looks += 1
                await asyncio.sleep(self.interval)

    def take(self) -> Wait | None:
        window, self.window = self.window, None
        return window

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


# -- the server's figures --------------------------------------------------------------------

FIGURES = """
WITH tree AS (SELECT relid, isleaf FROM pg_catalog.pg_partition_tree(%(outbox)s::regclass)),
parts AS (SELECT %(outbox)s::regclass AS relid UNION SELECT relid FROM tree),
stored AS (
    SELECT c.oid FROM pg_catalog.pg_class AS c
    WHERE c.relnamespace = %(schema)s::regnamespace AND c.relkind IN ('r', 'p', 'm')
)
SELECT
    (SELECT coalesce(sum(pg_catalog.pg_relation_size(relid)), 0) FROM parts)::int8,
    (SELECT coalesce(sum(pg_catalog.pg_indexes_size(relid)), 0) FROM parts)::int8,
    (SELECT coalesce(sum(pg_catalog.pg_total_relation_size(oid)), 0) FROM stored)::int8,
    (SELECT count(*) FROM tree WHERE isleaf)::int8,
    (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_catalog.pg_stat_user_tables
     WHERE relid IN (SELECT relid FROM parts))::int8,
    (SELECT coalesce(sum(autovacuum_count), 0) FROM pg_catalog.pg_stat_user_tables
     WHERE relid IN (SELECT oid FROM stored))::int8,
    pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), '0/0')::int8,
    (SELECT checkpoints_timed + checkpoints_req FROM pg_catalog.pg_stat_bgwriter)::int8
"""


@dataclass
class ServerFigures:
    table_bytes: int
    index_bytes: int
    store_bytes: int  # every table of the store's schema, with its indexes and TOAST
    partitions: int  # the outbox's partitions (0: not partitioned)
    dead_tuples: int
    autovacuums: int
    wal_bytes: int
    checkpoints: int


async def server_figures(
    conn: psycopg.AsyncConnection[Any], schema_name: str, outbox: str
) -> ServerFigures:
    qualified = sql.Identifier(schema_name, outbox).as_string(conn)
    quoted_schema = sql.Identifier(schema_name).as_string(conn)
    cursor = await conn.execute(FIGURES, {"outbox": qualified, "schema": quoted_schema})
    row = await cursor.fetchone()
    assert row is not None
    return ServerFigures(*(int(value) for value in row))
