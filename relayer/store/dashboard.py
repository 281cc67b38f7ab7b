"""The dashboard's side of one store: the small autocommit pool that the store's sampler and
the requests about it share, and the sampler's statements (a snapshot every interval, the
pending rows per lane in a slower refinement).

``DashboardPool.connection()`` lends a :data:`~relayer.store.driver.Connection` for a block;
a pool timeout, a closed pool, or a driver or socket error anywhere in the block becomes a
StoreError in the driver's own words, which a page shows as "cannot read the store: ..." and
the sampler logs. Statements live in ``relayer/sql/dashboard.sql``; no statement of the
snapshot counts a whole table (counts are capped), only the refinement does, under a timeout.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from relayer.settings import StoreSettings
from relayer.sql import Queries, queries_for
from relayer.store.driver import (
    DRIVER_ERRORS,
    Connection,
    connection_kwargs,
    translated_verbatim,
    verbatim_error,
)

COUNT_CAP = 10_000  # counts shown exactly up to this, then "10,000+"
PARKED_CAP = 100_000  # parked keys read per snapshot for the heat map
TOP_LANES = 50  # the lanes with the oldest heads, in a snapshot


class DashboardPool:
    """At most ``max_size`` autocommit connections to ``store``, named
    ``relayer:STORE:dashboard``; a request waits ``timeout`` seconds for one at most."""

    def __init__(self, store: StoreSettings, *, max_size: int, timeout: float) -> None:
        self.store = store
        self._pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            store.require_dsn(),
            min_size=1,
            max_size=max_size,
            open=False,
            timeout=timeout,
            kwargs=connection_kwargs(store, autocommit=True, name=f"{store.name}:dashboard"),
            name=f"relayer-dashboard-{store.name}",
        )

    @property
    def closed(self) -> bool:
        return self._pool.closed

    async def open(self) -> None:
        """Start opening connections without waiting for them: a store that cannot be reached
        yet shows the error on its pages instead of holding the dashboard up."""
        with translated_verbatim():
            await self._pool.open(wait=False)

    async def close(self) -> None:
        with translated_verbatim():
            await self._pool.close()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        try:
            async with self._pool.connection() as conn:
                yield conn
        except DRIVER_ERRORS as exc:
            raise verbatim_error(exc) from exc


@asynccontextmanager
async def without_jit(conn: Connection, store: StoreSettings) -> AsyncIterator[None]:
    """The block's statements in one transaction that compiles no plan with JIT, for a
    partitioned store (a delete-mode store: as they are). The planner cannot tell that a read
    of a lane's pending rows bounded by its head stops after a row or two, so it costs those
    statements high enough for JIT, whose compilation took most of a snapshot (about 130 ms
    against a few of work). Set for the transaction only: behind a transaction pooler too."""
    if store.storage != "partitioned":
        yield
        return
    async with conn.transaction():
        await conn.execute(
            queries_for(store.names)["set_local"], {"names": ["jit"], "values": ["off"]}
        )
        yield


@dataclass(frozen=True, slots=True)
class Capped:
    """A count read with a cap: ``value`` is exact unless ``more`` (then at least ``value``)."""

    value: int
    more: bool

    def __str__(self) -> str:
        return f"{self.value:,}+" if self.more else f"{self.value:,}"

    @classmethod
    def of(cls, counted: int) -> Capped:
        """A count read up to COUNT_CAP + 1 rows, as shown."""
        return cls(min(counted, COUNT_CAP), counted > COUNT_CAP)


@dataclass(frozen=True, slots=True)
class LiveMember:
    """A live member as its heartbeat row says: since when, the last renewal and its age."""

    instance: str
    since: datetime
    heartbeat: datetime
    heartbeat_age: float


@dataclass(frozen=True, slots=True)
class TableCounters:
    """The outbox's estimated size and its cumulative statistics counters: deletes are rows
    sent (or dropped), updates failed attempts (or redrives), inserts rows written.
    Partitioned storage: no estimate (0), inserts the outbox partitions', updates the held
    table's, deletes 0 (rows stay in their partition once sent; relayer.dashboard.sampler
    counts the rows sent from the inserts and the pending rows)."""

    estimated_rows: int
    live_rows: int
    inserted: int
    updated: int
    deleted: int


@dataclass(frozen=True, slots=True)
class SnapshotReading:
    """What one snapshot reads of the store's tables, in one go on one connection (the
    sampler reads the queues' states after it, through the queue controls)."""

    # The dash_lane_map row's first seven columns, as relayer.dashboard.lanes.lane_map reads them.
    lane_heads: tuple[Any, ...]
    # The flowing lanes whose head is at least ``stall_after`` old: (lane, its head id's tail).
    stall_candidates: tuple[tuple[int, int], ...]
    parked_keys: int  # at most PARKED_CAP
    parked_operator: int  # of them, the keys that wait for an operator
    members: tuple[LiveMember, ...]  # in the heartbeat's ranking
    pending: int  # counted up to COUNT_CAP + 1
    counters: TableCounters | None  # None: no outbox table
    unordered_age_seconds: float
    batches_open: int


async def read_snapshot(
    conn: Connection, store: StoreSettings, *, stall_after: float
) -> SnapshotReading:
    """One snapshot's statements, one after the other on ``conn`` (a partitioned store's in
    one transaction, see :func:`without_jit`)."""
    queries = queries_for(store.names, store.storage)
    with translated_verbatim():
        async with without_jit(conn, store):
            return await _read_snapshot(conn, store, queries, stall_after)


async def _read_snapshot(
    conn: Connection, store: StoreSettings, queries: Queries, stall_after: float
) -> SnapshotReading:
    cursor = await conn.execute(
        queries["dash_lane_map"],
        {"lanes": store.lanes, "cap": PARKED_CAP, "top": TOP_LANES, "stall_after": stall_after},
    )
    lane_row = await cursor.fetchone()
    cursor = await conn.execute(queries["dash_parked_totals"], {"cap": PARKED_CAP})
    parked = await cursor.fetchone()
    cursor = await conn.execute(queries["dash_members"])
    members = await cursor.fetchall()
    cursor = await conn.execute(queries["dash_pending_capped"], {"cap": COUNT_CAP + 1})
    pending = await cursor.fetchone()
    cursor = await conn.execute(
        queries["dash_table_counters"],
        {
            "schema": store.db_schema,
            "table": store.names.table("outbox"),
            "held": store.names.table("held"),  # partitioned storage's
        },
    )
    counters = await cursor.fetchone()
    cursor = await conn.execute(queries["dash_unordered_head"])
    unordered = await cursor.fetchone()
    cursor = await conn.execute(
        queries["dash_batches_open"], {"application": f"relayer:{store.name}:batch"}
    )
    batches = await cursor.fetchone()
    assert lane_row is not None and parked is not None  # aggregates: always one row
    return SnapshotReading(
        lane_heads=tuple(lane_row[:7]),
        stall_candidates=tuple((int(lane), int(tail)) for lane, tail in lane_row[7]),
        parked_keys=int(parked[0]),
        parked_operator=int(parked[1]),
        members=tuple(
            LiveMember(str(instance), since, renewed, float(age))
            for instance, since, renewed, _expires, age in members
        ),
        pending=int(pending[0]) if pending else 0,
        counters=TableCounters(*(int(value) for value in counters)) if counters else None,
        unordered_age_seconds=float(unordered[0]) if unordered else 0.0,
        batches_open=int(batches[0]) if batches else 0,
    )


async def read_lane_counts(
    conn: Connection, store: StoreSettings, *, statement_timeout: str
) -> tuple[tuple[int, int], ...]:
    """Pending rows per lane, (lane, rows), counted in full: a whole-table read, so in a
    transaction of its own whose statements end after ``statement_timeout`` ("10s")."""
    queries = queries_for(store.names, store.storage)
    with translated_verbatim():
        async with conn.transaction():
            await conn.execute(queries["dash_statement_timeout"], {"timeout": statement_timeout})
            cursor = await conn.execute(queries["dash_lane_counts"])
            row = await cursor.fetchone()
    assert row is not None  # an aggregate: always one row
    return tuple((int(lane), int(rows)) for lane, rows in zip(row[0], row[1], strict=True))
