"""Settings of unordered dispatch, maintenance and the inbox; the pending-id registry; the
maintenance queues in a worker's policy; health warnings."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from relayer.dispatch import Strict, Weighted
from relayer.operations.health import (
    PARTITIONS_AHEAD_WARNING,
    StoreHealth,
    TableHealth,
    warnings_of,
)
from relayer.settings import WorkerSettings, store_settings
from relayer.worker import Worker
from relayer.writer.after_commit import PendingIds
from tests.unit.test_settings import error_of


def test_defaults() -> None:
    store = store_settings(name="orders")
    assert store.unordered_grace == timedelta(seconds=30)
    assert store.maintenance_interval == timedelta(seconds=5)
    assert store.cleanup_interval == timedelta(minutes=1)
    assert store.inbox_retention == timedelta(days=7)
    assert store.parked_retention is None and store.sequence_retention is None
    assert store.sequence_numbers is False


def test_off_and_days() -> None:
    store = store_settings(inbox_retention="off", parked_retention="2d", unordered_grace=0)
    assert store.inbox_retention is None
    assert store.parked_retention == timedelta(days=2)
    assert store.unordered_grace == timedelta(0)


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("parked_retention", "30m", "at least 1 hour"),
        ("sequence_retention", "59m", "at least 1 hour"),
        ("inbox_retention", "0s", "greater than 0, or 'off'"),
        ("unordered_grace", "-1s", "from 0 seconds to 1 day"),
        ("unordered_grace", "2d", "from 0 seconds to 1 day"),
        ("maintenance_interval", 0, "greater than 0"),
        ("cleanup_interval", "soon", "must be a duration"),
    ],
)
def test_invalid_values_name_field_value_and_rule(field: str, value: object, rule: str) -> None:
    error = error_of(**{field: value})
    assert error.field == f"stores.orders.{field}"
    assert error.value == value
    assert rule in error.rule


def test_pending_ids_per_owner_with_a_bound() -> None:
    class Owner:
        pass

    pending = PendingIds(limit=3)
    first, second = Owner(), Owner()
    ids = [uuid.uuid4() for _ in range(5)]
    pending.add(first, ids[:2])
    pending.add(first, ids[2:])
    pending.add(second, ids[:1])
    assert len(pending) == 4
    assert pending.take(first) == ids[2:]  # the oldest beyond the bound are left to recovery
    assert pending.take(first) == []
    assert pending.forget(second) == 1
    transient = Owner()
    pending.add(transient, ids)
    del transient  # a closed connection's ids go with it
    assert len(pending) == 0


async def test_maintenance_queues_join_the_workers_policy() -> None:
    stores = [
        store_settings(name=name, dsn="postgresql://nowhere/db", table_prefix=f"{name}_")
        for name in ("orders", "billing")
    ]
    weighted = Worker(stores, settings=WorkerSettings(weights={"orders": 3}))
    assert weighted.group.policy == Weighted(
        [("orders", 3), ("billing", 1), ("orders:maintenance", 1), ("billing:maintenance", 1)]
    )
    strict = Worker(stores, settings=WorkerSettings(policy="strict", weights={"billing": 1}))
    assert strict.group.policy == Strict(
        "orders:maintenance", "billing:maintenance", "billing", "orders"
    )
    strict.group.validate()  # one source per queue


def health(*tables: TableHealth, due_age: float = 0.0, failing: int = 0) -> StoreHealth:
    return StoreHealth(tables, due_age, failing, 2 if failing else 0, "boom", ())


def test_health_warnings_follow_the_documented_thresholds() -> None:
    store = store_settings(name="orders")
    vacuumed = datetime.now(UTC) - timedelta(hours=3)
    fine = TableHealth("orders_outbox", 100_000, 9_999, vacuumed, 1)
    small = TableHealth("orders_outbox", 10, 50_000, None, 1)
    assert warnings_of(health(fine), store) == ()
    assert not fine.bloated and small.bloated
    [dead] = warnings_of(health(TableHealth("orders_outbox", 30_000, 10_000, vacuumed, 1)), store)
    assert "10,000 dead tuples (25%)" in dead and "3.0 h ago" in dead
    assert len(warnings_of(health(due_age=301), store)) == 1
    assert warnings_of(health(due_age=299), store) == ()
    [failing] = warnings_of(health(failing=4), store)
    assert "4 unordered rows are failing" in failing and "boom" in failing


def test_the_partitions_warning_comes_under_half_the_spans_ahead() -> None:
    store = store_settings(name="orders", storage="partitioned", partition_span="1m")

    def warnings(ahead: float | None) -> tuple[str, ...]:
        found = StoreHealth((), 0.0, 0, 0, None, (), partitions_ahead_seconds=ahead)
        return warnings_of(found, store)

    assert warnings(None) == ()  # delete mode
    assert warnings(PARTITIONS_AHEAD_WARNING * 60) == ()
    [soon] = warnings(PARTITIONS_AHEAD_WARNING * 60 - 1)
    assert soon.startswith("the partitions ahead of the database clock run out in 299 s")
    assert "`relayer partitions rotate orders`" in soon and "stores.orders.admin_dsn" in soon
    [gone] = warnings(-5)
    assert "run out already" in gone and "no partition of relation" in gone
