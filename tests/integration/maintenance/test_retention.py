"""Retention: inbox entries and key states past inbox_retention, idle sequence counters, and
keys that waited for an operator past parked_retention; nothing else is deleted."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import psycopg
import pytest

from relayer import Outbox, OutboxMessage
from relayer.inbox import Inbox
from relayer.settings import StoreSettings
from relayer.worker.maintenance import CleanupReport, Task, _task_lock_key, cleanup
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import keys_in_lane
from tests.integration.unordered.helpers import run_worker_until


async def store_with(dsn: str, **overrides: Any) -> StoreSettings:
    settings = make_store(dsn, **overrides)
    await apply_schema(settings)
    return settings


async def run_cleanup(store: StoreSettings) -> CleanupReport:
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        return await cleanup(conn, store)


def execute(store: StoreSettings, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(store.require_dsn()) as conn:
        cursor = conn.execute(statement.replace("{p}", store.table_prefix), params)
        found = cursor.fetchall() if cursor.description else []
        conn.commit()
    return found


def claim_messages(store: StoreSettings, count: int) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(count)]
    with psycopg.connect(store.require_dsn()) as conn:
        for number, message_id in enumerate(ids, start=1):
            Inbox(store).claim(conn, message_id, "billing", key=f"k{number}", sequence=1)
        conn.commit()
    return ids


async def test_inbox_entries_and_key_states_expire(pg_dsn: str) -> None:
    store = await store_with(pg_dsn, inbox_retention="7d")
    old_message, old_state, fresh = claim_messages(store, 3)
    execute(
        store,
        "UPDATE {p}inbox SET received_at = now() - interval '8 days' WHERE message_id = %s",
        old_message,
    )
    execute(
        store,
        "UPDATE {p}inbox_keys SET updated_at = now() - interval '8 days' WHERE ordering_key = 'k2'",
    )
    report = await run_cleanup(store)
    assert (report.inbox, report.inbox_keys, report.skipped) == (1, 1, False)
    left = {row[0] for row in execute(store, "SELECT message_id FROM {p}inbox")}
    assert left == {old_state, fresh}
    keys = {row[0] for row in execute(store, "SELECT ordering_key FROM {p}inbox_keys")}
    assert keys == {"k1", "k3"}


async def test_inbox_retention_off_keeps_everything(pg_dsn: str) -> None:
    store = await store_with(pg_dsn, inbox_retention="off")
    claim_messages(store, 2)
    execute(store, "UPDATE {p}inbox SET received_at = now() - interval '1000 days'")
    assert (await run_cleanup(store)).inbox == 0
    assert len(execute(store, "SELECT 1 FROM {p}inbox")) == 2


def park(store: StoreSettings, key: str, *, retrying: bool, waited: str) -> list[uuid.UUID]:
    """Two rows of ``key``, its head parked ``waited`` ago (retrying or for an operator)."""
    with psycopg.connect(store.require_dsn()) as conn:
        ids = Outbox(store).write_many(conn, [OutboxMessage("d", b"x", key=key)] * 2)
        conn.execute(
            f"INSERT INTO {store.table_prefix}parked "
            "(ordering_key, lane, head_id, attempts, last_error, retry_at, updated_at) "
            "SELECT ordering_key, lane, id, 10, 'topic missing', "
            "CASE WHEN %s THEN now() + interval '1 minute' END, now() - %s::interval "
            f"FROM {store.table_prefix}outbox WHERE id = %s",
            (retrying, waited, ids[0]),
        )
        conn.commit()
    return ids


async def test_parked_keys_are_kept_unless_parked_retention_is_set(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = await store_with(pg_dsn)
    expired, young, retrying = keys_in_lane(store, 3, 3)
    park(store, expired, retrying=False, waited="3 hours")
    young_rows = park(store, young, retrying=False, waited="30 minutes")
    retrying_rows = park(store, retrying, retrying=True, waited="3 hours")
    assert (await run_cleanup(store)).parked_keys == 0  # off by default
    store = make_store(pg_dsn, parked_retention="2h")
    with caplog.at_level(logging.WARNING, logger="relayer.worker.maintenance"):
        report = await run_cleanup(store)
    assert (report.parked_keys, report.parked_rows) == (1, 2)
    parked = {row[0] for row in execute(store, "SELECT ordering_key FROM {p}parked")}
    assert parked == {young, retrying}
    left = {row[0] for row in execute(store, "SELECT id FROM {p}outbox")}
    assert left == set(young_rows + retrying_rows)
    [record] = [r for r in caplog.records if getattr(r, "action", "") == "parked_expired"]
    assert record.key == expired and record.rows == 2  # type: ignore[attr-defined]
    assert "topic missing" in record.getMessage()


async def test_idle_sequence_counters_without_pending_rows_expire(pg_dsn: str) -> None:
    store = await store_with(pg_dsn, sequence_numbers=True, sequence_retention="2h")
    with psycopg.connect(store.require_dsn()) as conn:
        Outbox(store).write_many(conn, [OutboxMessage("d", b"x", key=k) for k in "abc"])
        conn.commit()
    execute(store, "DELETE FROM {p}outbox WHERE ordering_key <> 'b'")  # a and c were sent
    execute(
        store,
        "UPDATE {p}sequences SET updated_at = now() - interval '3 hours' "
        "WHERE ordering_key IN ('a', 'b')",
    )
    assert (await run_cleanup(store)).sequences == 1
    kept = {row[0] for row in execute(store, "SELECT ordering_key FROM {p}sequences")}
    assert kept == {"b", "c"}  # b still has a pending row; c was used recently


async def test_one_cleanup_at_a_time(pg_dsn: str) -> None:
    store = await store_with(pg_dsn)
    lock = _task_lock_key(store, Task.CLEANUP)
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as other:
        await other.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))  # another worker's pass
        assert (await run_cleanup(store)).skipped
        await other.rollback()
    assert not (await run_cleanup(store)).skipped


async def test_the_worker_owning_lane_0_runs_the_cleanup(pg_dsn: str) -> None:
    store = await store_with(
        pg_dsn,
        lanes=2,
        lease_duration="3s",
        poll_interval="0.1s",
        cleanup_interval="0.1s",
        transports={"memory": {"type": "memory"}},
    )
    claim_messages(store, 2)
    execute(store, "UPDATE {p}inbox SET received_at = now() - interval '30 days'")
    worker = await run_worker_until(store, lambda: not execute(store, "SELECT 1 FROM {p}inbox"))
    assert worker.stores[store.name].maintenance.last_cleanup is not None
