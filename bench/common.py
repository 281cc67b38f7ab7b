"""Shared set-up for the benchmarks: a PostgreSQL to measure against, and result printing.

The DSN comes from ``--dsn``, ``RELAYER_BENCH_DSN`` or ``RELAYER_DSN``; without one an embedded
PostgreSQL (durable settings, fsync on) is started for the run. Benchmarks print figures and
ratios measured in one run; they never assert on timings.
"""

from __future__ import annotations

import contextlib
import os
import platform
import uuid
from collections.abc import Iterator

import psycopg
from psycopg import sql


@contextlib.contextmanager
def postgres(dsn: str | None) -> Iterator[str]:
    dsn = dsn or os.environ.get("RELAYER_BENCH_DSN") or os.environ.get("RELAYER_DSN")
    if dsn:
        yield dsn
        return
    from relayer.embedded import EmbeddedPostgres

    with EmbeddedPostgres() as server:
        yield server.dsn


@contextlib.contextmanager
def scratch_schema(dsn: str, prefix: str = "bench") -> Iterator[str]:
    """A schema that exists for the duration of one benchmark and is dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def machine() -> str:
    cpus = os.cpu_count() or 0
    return f"{platform.python_implementation()} {platform.python_version()}, {cpus} CPUs"


def server_version(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        sync = conn.execute("SHOW synchronous_commit").fetchone()
        fsync = conn.execute("SHOW fsync").fetchone()
    assert row and sync and fsync
    return f"PostgreSQL {row[0]} (fsync={fsync[0]}, synchronous_commit={sync[0]})"
