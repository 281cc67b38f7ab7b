"""A store's table health: dead tuples, last vacuum, sizes, the oldest due row, failing rows.

An outbox is a queue table: every row is inserted and deleted soon after, so it lives on
autovacuum. When vacuum falls behind (a long transaction, an abandoned replication slot, a
scale factor too high for a table this busy), dead tuples pile up and every scan slows down.
The gateway reads what is needed to notice (relayer.store.maintenance.read_health), and
``warnings_of`` says what to look at; the thresholds below are documented in
docs/operations.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from relayer.settings import StoreSettings

# Dead tuples worth a warning: at least this many, and this share of the table's tuples.
DEAD_ROWS_WARNING = 10_000
DEAD_RATIO_WARNING = 0.2
# A due row older than this means the relay is not keeping up (or a key waits for an operator).
DUE_AGE_WARNING = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class TableHealth:
    table: str
    live_rows: int
    dead_rows: int
    last_vacuum: datetime | None  # the later of the last autovacuum and manual vacuum
    size_bytes: int  # table, indexes and TOAST

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
    warnings: tuple[str, ...]


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
    if health.unordered_failing:
        warnings.append(
            f"{health.unordered_failing:,} unordered rows are failing (up to "
            f"{health.unordered_max_attempts} attempts; latest error: "
            f"{health.unordered_last_error}); they are retried until they go through"
        )
    return tuple(warnings)


def _ago(moment: datetime) -> str:
    seconds = max((datetime.now(UTC) - moment).total_seconds(), 0)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
