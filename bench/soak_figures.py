"""bench/soak.py's figures: the counters read at each sample (the worker's metrics and CPU, the
private cluster's CPU, the server's figures, the worker's head probe) and the line printed."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from bench.cpu import family_seconds, process_seconds, thread_seconds
from bench.metrics_scrape import get, value
from bench.soak_load import HeldSnapshot, LockSampler, ServerFigures, Writers, server_figures
from relayer.embedded import EmbeddedPostgres
from relayer.settings import StoreSettings
from relayer.store import wire
from relayer.store.relay import RelayStore

MB = 1024 * 1024


@dataclass
class Reading:
    """Counters at one moment; a sample is the difference of two."""

    at: float
    written: int
    sent: int
    worker_cpu: float
    pg_cpu: float  # the cluster less the soak's monitoring sessions
    writer_backends_cpu: float
    figures: ServerFigures


@dataclass
class Sample:
    minute: float
    target: float
    written_per_s: float
    sent_per_s: float
    backlog: int
    read_ms_p50: float
    read_ms_max: float
    read_blocks_p50: float
    table_mb: float
    index_mb: float
    store_mb: float
    partitions: int
    dead_tuples: int
    autovacuums: int
    checkpoints: int
    wal_bytes_per_msg: float | None
    pg_us_per_msg: float | None
    pg_writers_us_per_msg: float | None
    worker_us_per_msg: float | None
    held: bool
    lock_wait_ms: float | None = None  # the longest wait seen in the interval
    lock_waiter: str | None = None  # whose, on what lock


@dataclass
class Monitor:
    """Reads the counters of one mode's run: the worker's metrics and CPU, the cluster's CPU,
    the server's figures and the head probe's time."""

    server: EmbeddedPostgres
    store: StoreSettings
    conn: psycopg.AsyncConnection[Any]
    worker_pid: int
    metrics_port: int
    writers: Writers
    locks: LockSampler | None
    held: HeldSnapshot
    read_lanes: int = 8  # lanes whose head is read at each sample, spread over the store's
    monitors: list[int] = field(default_factory=list)  # the soak's own backends

    async def sent(self) -> int:
        text = (await asyncio.to_thread(get, self.metrics_port, "/metrics")).decode()
        return int(value(text, "relayer_messages_sent_total") or 0)

    def pg_cpu(self) -> float:
        pid = self.server.postmaster_pid
        total = family_seconds(pid) if pid else 0.0
        pids = [*self.monitors, *([self.locks.backend_pid] if self.locks else [])]
        return total - sum(thread_seconds(pid, pid) or 0.0 for pid in pids)

    async def read(self) -> Reading:
        figures = await server_figures(self.conn, self.store.db_schema, self.outbox)
        return Reading(
            at=time.perf_counter(),
            written=self.writers.written,
            sent=await self.sent(),
            worker_cpu=process_seconds(self.worker_pid),
            pg_cpu=self.pg_cpu(),
            writer_backends_cpu=sum(
                thread_seconds(pid, pid) or 0.0 for pid in self.writers.backend_pids()
            ),
            figures=figures,
        )

    @property
    def outbox(self) -> str:
        return self.store.names.table("outbox")

    async def head_reads(self) -> list[tuple[float, int]]:
        """The worker's head probe (RelayStore.probe's statement) of ``read_lanes`` lanes spread
        over the store, one at a time, under EXPLAIN ANALYZE: its execution time in the server
        (ms; a busy machine's scheduler left out) and the buffers it touched, sorted by time."""
        probe = RelayStore(self.store).queries["probe"]
        explain = sql.SQL("EXPLAIN (ANALYZE, TIMING OFF, BUFFERS, FORMAT JSON) ") + sql.SQL(probe)
        reads = []
        lanes = self.store.lanes
        for lane in sorted({index * lanes // self.read_lanes for index in range(self.read_lanes)}):
            # limit: partitioned storage's head read (one row), as RelayStore.probe passes it.
            params = {"lanes": wire.text_list([lane]), "limit": 1}
            cursor = await self.conn.execute(explain, params)
            row = await cursor.fetchone()
            assert row is not None
            found = row[0] if isinstance(row[0], list) else json.loads(row[0])
            plan = found[0]
            touched = plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get(
                "Shared Read Blocks", 0
            )
            reads.append((float(plan["Execution Time"]), int(touched)))
        return sorted(reads)


def per_message(amount: float, sent: int, scale: float) -> float | None:
    return amount * scale / sent if sent > 0 else None


def sample_of(
    before: Reading, after: Reading, started: float, target: float, reads: list[tuple[float, int]]
) -> Sample:
    seconds = max(after.at - before.at, 1e-9)
    sent = after.sent - before.sent
    figures = after.figures
    return Sample(
        minute=round((after.at - started) / 60, 2),
        target=target,
        written_per_s=(after.written - before.written) / seconds,
        sent_per_s=sent / seconds,
        backlog=after.written - after.sent,
        read_ms_p50=statistics.median(read[0] for read in reads),
        read_ms_max=reads[-1][0],
        read_blocks_p50=statistics.median(read[1] for read in reads),
        table_mb=figures.table_bytes / MB,
        index_mb=figures.index_bytes / MB,
        store_mb=figures.store_bytes / MB,
        partitions=figures.partitions,
        dead_tuples=figures.dead_tuples,
        autovacuums=figures.autovacuums - before.figures.autovacuums,
        checkpoints=figures.checkpoints - before.figures.checkpoints,
        wal_bytes_per_msg=per_message(figures.wal_bytes - before.figures.wal_bytes, sent, 1),
        pg_us_per_msg=per_message(after.pg_cpu - before.pg_cpu, sent, 1e6),
        pg_writers_us_per_msg=per_message(
            after.writer_backends_cpu - before.writer_backends_cpu, sent, 1e6
        ),
        worker_us_per_msg=per_message(after.worker_cpu - before.worker_cpu, sent, 1e6),
        held=False,
    )


def optional(number: float | None, form: str) -> str:
    return "-" if number is None else format(number, form)


def line(mode: str, sample: Sample) -> str:
    parts = [
        f"{mode:<11} {sample.minute:6.2f} min: wrote {sample.written_per_s:>7,.0f}/s sent "
        f"{sample.sent_per_s:>7,.0f}/s backlog {sample.backlog:>9,}",
        f"head read {sample.read_ms_p50:6.2f}/{sample.read_ms_max:6.2f} ms "
        f"{sample.read_blocks_p50:,.0f} blocks",
        f"outbox {sample.table_mb:,.0f}+{sample.index_mb:,.0f} MB"
        + (f" in {sample.partitions} partitions" if sample.partitions else "")
        + f", store {sample.store_mb:,.0f} MB, dead {sample.dead_tuples:>9,}, "
        f"av {sample.autovacuums} ckpt {sample.checkpoints}",
        f"WAL {optional(sample.wal_bytes_per_msg, ',.0f')} B/msg",
        f"pg {optional(sample.pg_us_per_msg, '.1f')} µs/msg (writers' sessions "
        f"{optional(sample.pg_writers_us_per_msg, '.1f')})",
        f"worker {optional(sample.worker_us_per_msg, '.1f')} µs/msg",
    ]
    if sample.held:
        parts.append("held")
    if sample.lock_wait_ms is not None:
        waiter = f" ({sample.lock_waiter})" if sample.lock_waiter else ""
        parts.append(f"lock wait {sample.lock_wait_ms:.0f} ms{waiter}")
    return " | ".join(parts)
