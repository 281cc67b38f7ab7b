"""The sampler's rate chart from the table counters: deletes are rows sent in delete mode;
partitioned storage deletes no row it sends, so rows sent are rows written less the change in
pending rows, with no point while the pending rows are past the count's cap."""

from __future__ import annotations

from typing import Any

from relayer.dashboard.sampler import COUNT_CAP, StoreSampler
from relayer.settings import store_settings
from relayer.store.dashboard import TableCounters


def sampler(storage: str) -> StoreSampler:
    store = store_settings(
        name="orders",
        dsn="postgresql://nowhere/db",
        storage=storage,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    pool: Any = None  # never used: no snapshot is taken
    return StoreSampler(store, pool)


def counters(inserted: int, updated: int = 0, deleted: int = 0) -> TableCounters:
    return TableCounters(0, 0, inserted, updated, deleted)


def totals(chart: StoreSampler) -> dict[str, float]:
    series = chart.rates.series()
    return {name: sum(series[name]) for name in ("written", "sent", "failed")}


def test_partitioned_rows_sent_are_rows_written_less_the_change_in_pending_rows() -> None:
    chart = sampler("partitioned")
    chart._add_rates(counters(100, updated=1), pending=100)  # the first reading: no point
    chart._add_rates(counters(150, updated=3), pending=30)
    assert totals(chart) == {"written": 50, "sent": 120, "failed": 2}
    chart._add_rates(counters(COUNT_CAP * 2), pending=COUNT_CAP + 1)  # not counted exactly
    chart._add_rates(counters(COUNT_CAP * 3), pending=10)  # starts again: no point
    assert totals(chart) == {"written": 50, "sent": 120, "failed": 2}
    chart._add_rates(counters(COUNT_CAP * 3 + 5), pending=5)
    assert totals(chart) == {"written": 55, "sent": 130, "failed": 2}


def test_delete_mode_rows_sent_are_the_outbox_deletes() -> None:
    chart = sampler("delete")
    chart._add_rates(counters(100, deleted=40), pending=COUNT_CAP + 1)
    chart._add_rates(counters(150, deleted=90), pending=COUNT_CAP + 1)
    assert totals(chart) == {"written": 50, "sent": 50, "failed": 0}
