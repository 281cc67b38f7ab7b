"""The statements of a store's maintenance (relayer.worker.maintenance): retention passes under
a task lock, dropping keys that waited too long for an operator, and the table health check.

Statements live in ``relayer/sql/maintenance.sql`` and ``inbox.sql``; each method of
:class:`MaintenanceStore` runs its own transaction(s) on ``conn`` (autocommit off) and raises
StoreError for driver errors. :func:`read_table_health` is also what ``relayer status`` and
the dashboard read, in their own transaction. For a partitioned store the outbox's line is the
sum over its partitions, with their count, and the health says how far ahead of the database
clock the newest partition reaches (:func:`read_partition_health`, ``partition_ops.sql``).
The health is read here without warnings: what an operator should look at is
relayer.operations.health's (``warnings_of``, ``with_warnings``), which re-exports the values
defined here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from relayer.identifiers import TABLE_SUFFIXES
from relayer.redact import redact
from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.store.driver import Connection, translated
from relayer.store.partitions import ms_of

# Dead tuples that make a table bloated: at least this many, and this share of its tuples
# (docs/operations.md).
DEAD_ROWS_WARNING = 10_000
DEAD_RATIO_WARNING = 0.2


@dataclass(frozen=True, slots=True)
class TableHealth:
    table: str
    live_rows: int
    dead_rows: int
    last_vacuum: datetime | None  # the later of the last autovacuum and manual vacuum
    size_bytes: int  # table, indexes and TOAST
    # A partitioned outbox: how many partitions the other values are summed over (None: a
    # table of its own).
    partitions: int | None = None

    @property
    def dead_ratio(self) -> float:
        total = self.live_rows + self.dead_rows
        return self.dead_rows / total if total else 0.0

    @property
    def bloated(self) -> bool:
        return self.dead_rows >= DEAD_ROWS_WARNING and self.dead_ratio >= DEAD_RATIO_WARNING


@dataclass(frozen=True, slots=True)
class StoreHealth:
    tables: tuple[TableHealth, ...]
    oldest_due_age_seconds: float  # the oldest row by id that is due (parked keys included)
    unordered_failing: int  # unordered rows that failed at least once and wait for a retry
    unordered_max_attempts: int
    unordered_last_error: str | None
    warnings: tuple[str, ...]  # empty as read here (relayer.operations.health.with_warnings)
    # A partitioned store: how far ahead of the database clock its newest partition reaches,
    # in seconds (a writer's row past it is refused); None in delete mode.
    partitions_ahead_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    """A partitioned outbox's partitions, summed (:func:`read_partition_health`)."""

    partitions: int
    live_rows: int  # the statistics' estimate, sent rows included until their partition goes
    dead_rows: int
    last_vacuum: datetime | None  # the latest of any partition's
    size_bytes: int
    ahead_seconds: float  # the newest partition's upper bound less the database clock


@dataclass(frozen=True, slots=True)
class DroppedKey:
    """A parked key dropped by retention: its rows, head, attempts, error and wait."""

    rows: int
    head_id: object
    attempts: int
    error: str | None
    waited_seconds: float


class MaintenanceStore:
    """The maintenance statements of one store."""

    def __init__(self, store: StoreSettings) -> None:
        self.store = store
        self.queries = queries_for(store.names, store.storage)

    async def expire(
        self, conn: Connection, query: str, lock: int, retention: timedelta, limit: int
    ) -> int | None:
        """One retention statement (``query``: ``inbox_expire``, ``inbox_keys_expire`` or
        ``sequences_expire``) deleting at most ``limit`` rows older than ``retention``, in a
        transaction holding the advisory lock ``lock``; None if another worker holds it."""
        with translated(self.store, "apply retention"):
            async with conn.transaction():
                cursor = await conn.execute(self.queries["maintenance_try_lock"], {"key": lock})
                locked = await cursor.fetchone()
                if not (locked and locked[0]):
                    return None
                cursor = await conn.execute(
                    self.queries[query], {"retention": retention, "limit": limit}
                )
            return cursor.rowcount

    async def parked_expired(
        self, conn: Connection, retention: timedelta, limit: int
    ) -> list[tuple[str, int]]:
        """Keys (with their lanes) that waited for an operator longer than ``retention``."""
        with translated(self.store, "find expired parked keys"):
            async with conn.transaction():
                cursor = await conn.execute(
                    self.queries["parked_expired"], {"retention": retention, "limit": limit}
                )
                return [(str(key), int(lane)) for key, lane in await cursor.fetchall()]

    async def drop_expired_parked_key(
        self, conn: Connection, key: str, lane: int, retention: timedelta
    ) -> DroppedKey | None:
        """Like ``relayer parked drop``: wait for a batch in flight on the lane, then drop the
        key's rows if it still waits for an operator since ``retention`` (None otherwise)."""
        with translated(self.store, "drop an expired parked key"):
            async with conn.transaction():
                await conn.execute(self.queries["lock_lane_for_operator"], {"lane": lane})
                cursor = await conn.execute(
                    self.queries["drop_expired_parked_key"], {"key": key, "retention": retention}
                )
                dropped = await cursor.fetchone()
        if dropped is None:
            return None
        count, head, attempts, error, waited = dropped
        return DroppedKey(int(count), head, int(attempts), error, float(waited))

    async def health(self, conn: Connection) -> StoreHealth:
        """The table health (without warnings), read in a transaction rolled back after."""
        with translated(self.store, "read the table health"):
            try:
                return await read_table_health(conn, self.store)
            finally:
                await conn.rollback()

    async def look(self, conn: Connection) -> tuple[StoreHealth, bool]:
        """The table health (without warnings), and whether a retention has rows to delete, in
        one statement on an autocommit connection (the worker's housekeeping connection)."""
        with translated(self.store, "read the table health"):
            return await read_health_and_retention(conn, self.store)


async def read_table_health(conn: Connection, store: StoreSettings) -> StoreHealth:
    """Read the health of ``store``'s tables, without warnings (read-only, one statement
    reading the outbox and the catalog only, so an operator's role can run it, and for a
    partitioned store one more of the catalog; cheap enough for every status call)."""
    health, _ = await _read(conn, store, with_retention=False)
    return health


async def read_health_and_retention(
    conn: Connection, store: StoreSettings
) -> tuple[StoreHealth, bool]:
    """The health of ``store``'s tables (without warnings), and whether a retention setting has
    rows to delete (relayer.worker.maintenance.cleanup would delete some), in one read-only
    statement (it reads the inbox, sequence and parked tables too: the relay's role)."""
    return await _read(conn, store, with_retention=True)


async def _read(
    conn: Connection, store: StoreSettings, *, with_retention: bool
) -> tuple[StoreHealth, bool]:
    params: dict[str, Any] = {
        "schema": store.db_schema,
        "tables": [store.names.table(role) for role in TABLE_SUFFIXES],
    }
    if with_retention:
        params.update(
            inbox_retention=store.inbox_retention,
            sequence_retention=store.sequence_retention,
            parked_retention=store.parked_retention,
        )
    query = "store_health_and_retention" if with_retention else "store_health"
    cursor = await conn.execute(
        queries_for(store.names, store.storage)[query],
        params,
        prepare=False,  # once a cleanup_interval: not worth a prepared statement's memory
    )
    row = await cursor.fetchone()
    assert row is not None  # one row, whatever the tables hold
    names, live, dead, vacuumed, sizes, due_age, failing, attempts, error = row[:9]
    found = tuple(
        TableHealth(str(name), int(live_rows), int(dead_rows), vacuum, int(size))
        for name, live_rows, dead_rows, vacuum, size in zip(
            names, live, dead, vacuumed, sizes, strict=True
        )
    )
    shown = redact(error) if error else error  # a broker's URL in it may hold a password
    health = StoreHealth(found, float(due_age), int(failing), int(attempts), shown, ())
    retention_due = bool(row[9]) if with_retention else False
    if store.storage == "partitioned":
        health = _with_partitions(health, store, await read_partition_health(conn, store))
    return health, retention_due


async def read_partition_health(conn: Connection, store: StoreSettings) -> PartitionHealth:
    """``store``'s outbox partitions summed, and how far ahead of the database clock the newest
    reaches (negative: passed; no partition: 0). Catalog reads only; driver errors as raised."""
    names = store.names
    cursor = await conn.execute(
        queries_for(names)["partition_health"],
        {"parent": f'"{names.schema}"."{names.table("outbox")}"'},
        prepare=False,
    )
    row = await cursor.fetchone()
    assert row is not None  # an aggregate: one row
    count, live, dead, vacuumed, size, upper, clock_ms = row
    ahead = 0.0 if upper is None else (ms_of(UUID(upper)) - int(clock_ms)) / 1000
    return PartitionHealth(int(count), int(live), int(dead), vacuumed, int(size), ahead)


def _with_partitions(
    health: StoreHealth, store: StoreSettings, found: PartitionHealth
) -> StoreHealth:
    """``health`` with the outbox's line the sum of its partitions (a partitioned table has no
    storage of its own) and how far ahead they reach."""
    outbox = store.names.table("outbox")
    tables = tuple(
        TableHealth(
            table.table,
            found.live_rows,
            found.dead_rows,
            found.last_vacuum,
            found.size_bytes,
            found.partitions,
        )
        if table.table == outbox
        else table
        for table in health.tables
    )
    return replace(health, tables=tables, partitions_ahead_seconds=found.ahead_seconds)
