"""A store's table health: dead tuples, last vacuum, sizes, the oldest due row, failing rows,
and for a partitioned store how far ahead of the database clock its partitions reach.

An outbox is a queue table: every row is inserted and deleted soon after, so it lives on
autovacuum. When vacuum falls behind (a long transaction, an abandoned replication slot, a
scale factor too high for a table this busy), dead tuples pile up and every scan slows down.
The gateway reads what is needed to notice (relayer.store.maintenance, where the values and
the bloat thresholds are defined; they are named here for their users), and ``warnings_of``
says what to look at; the thresholds are documented in docs/operations.md.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from relayer.settings import StoreSettings
from relayer.store.driver import Connection
from relayer.store.maintenance import (
    DEAD_RATIO_WARNING,
    DEAD_ROWS_WARNING,
    StoreHealth,
    TableHealth,
    read_table_health,
)
from relayer.store.partitions import PARTITIONS_AHEAD

__all__ = [
    "DEAD_RATIO_WARNING",
    "DEAD_ROWS_WARNING",
    "DUE_AGE_WARNING",
    "PARTITIONS_AHEAD_WARNING",
    "StoreHealth",
    "TableHealth",
    "read_health",
    "warnings_of",
    "with_warnings",
]

# A due row older than this means the relay is not keeping up (or a key waits for an operator).
DUE_AGE_WARNING = timedelta(minutes=5)
# Fewer partition spans than this ahead of the database clock means rotation is not keeping up
# (it makes PARTITIONS_AHEAD of them); when none is left, writers fail (docs/storage.md).
PARTITIONS_AHEAD_WARNING = PARTITIONS_AHEAD // 2


async def read_health(conn: Connection, store: StoreSettings) -> StoreHealth:
    """The health of ``store``'s tables with its warnings, as ``relayer status`` shows it (the
    statement: relayer.store.maintenance.read_table_health; driver errors as it raises them)."""
    return with_warnings(await read_table_health(conn, store), store)


def with_warnings(health: StoreHealth, store: StoreSettings) -> StoreHealth:
    """``health`` as read by the gateway, with what an operator should look at."""
    return replace(health, warnings=warnings_of(health, store))


def warnings_of(health: StoreHealth, store: StoreSettings) -> tuple[str, ...]:
    """What an operator should look at, each with the advice of docs/operations.md."""
    warnings: list[str] = []
    for table in health.tables:
        if table.bloated:
            vacuumed = (
                "never vacuumed"
                if table.last_vacuum is None
                else f"last vacuumed {_ago(table.last_vacuum)} ago"
            )
            warnings.append(
                f"{table.table}: {table.dead_rows:,} dead tuples ({table.dead_ratio:.0%}), "
                f"{vacuumed}; autovacuum is behind: look for long transactions and stale "
                "replication slots, and lower autovacuum_vacuum_scale_factor for this table"
            )
    if health.oldest_due_age_seconds > DUE_AGE_WARNING.total_seconds():
        warnings.append(
            f"the oldest due row has waited {health.oldest_due_age_seconds:,.0f} s: check that "
            f"workers run (`relayer status {store.name}`), parked keys and the broker"
        )
    partitions = _partitions_warning(health, store)
    if partitions:
        warnings.append(partitions)
    if health.unordered_failing:
        warnings.append(
            f"{health.unordered_failing:,} unordered rows are failing (up to "
            f"{health.unordered_max_attempts} attempts; latest error: "
            f"{health.unordered_last_error}); they are retried until they go through"
        )
    return tuple(warnings)


def _partitions_warning(health: StoreHealth, store: StoreSettings) -> str | None:
    """Whether a partitioned store's partitions ahead run out soon, and what to do."""
    ahead = health.partitions_ahead_seconds
    span = store.partition_span.total_seconds()
    if ahead is None or ahead >= PARTITIONS_AHEAD_WARNING * span:
        return None
    when = f"in {ahead:,.0f} s" if ahead > 0 else "already"
    return (
        f"the partitions ahead of the database clock run out {when} (fewer than "
        f"{PARTITIONS_AHEAD_WARNING} of the {PARTITIONS_AHEAD} spans of partition_span rotation "
        'keeps ahead); writers then fail with "no partition of relation ... found for row": '
        "rotation is not keeping up: look for rotation_skipped in the logs of the worker "
        f"leading the cleanup, set stores.{store.name}.admin_dsn to the tables' owner or run "
        f"`relayer partitions rotate {store.name}`, and keep cleanup_interval under "
        f"{PARTITIONS_AHEAD_WARNING} x partition_span"
    )


def _ago(moment: datetime) -> str:
    seconds = max((datetime.now(UTC) - moment).total_seconds(), 0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
