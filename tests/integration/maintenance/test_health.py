"""The table-health check of `relayer status`: dead tuples, failing unordered rows, the oldest
due row; and what the status shows of it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict

import psycopg

from relayer import Outbox, OutboxMessage
from relayer.cli.status_command import render
from relayer.operations.health import DEAD_ROWS_WARNING, StoreHealth, read_health
from relayer.operations.status import read_status
from relayer.settings import StoreSettings


async def health_of(store: StoreSettings) -> StoreHealth:
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        return await read_health(conn, store)


async def test_a_fresh_store_is_healthy(store: StoreSettings) -> None:
    health = await health_of(store)
    names = {table.table for table in health.tables}
    assert {"orders_outbox", "orders_parked", "orders_inbox", "orders_sequences"} <= names
    assert health.warnings == ()
    assert health.unordered_failing == 0


async def test_dead_tuples_in_the_outbox_are_reported(store: StoreSettings) -> None:
    rows = DEAD_ROWS_WARNING + 2_000
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute("ALTER TABLE orders_outbox SET (autovacuum_enabled = false)")
        conn.execute(
            "INSERT INTO orders_outbox (id, lane, destination, body) "
            "SELECT gen_random_uuid(), -1, 'd', 'x' FROM generate_series(1, %s)",
            (rows,),
        )
        conn.execute("DELETE FROM orders_outbox")
        conn.execute("SELECT pg_stat_force_next_flush()")
    async with asyncio.timeout(20):  # statistics reach other sessions after a flush
        while not (health := await health_of(store)).warnings:
            await asyncio.sleep(0.1)
    [outbox] = [table for table in health.tables if table.table == "orders_outbox"]
    assert outbox.dead_rows >= rows and outbox.bloated
    assert any(
        "orders_outbox" in warning and "autovacuum" in warning for warning in health.warnings
    )


async def test_failing_unordered_rows_and_an_old_due_row_are_reported(
    store: StoreSettings,
) -> None:
    with psycopg.connect(store.require_dsn()) as conn:
        ids = Outbox(store).write_many(conn, [OutboxMessage("d", b"x")] * 2)
        conn.execute(
            "UPDATE orders_outbox SET attempts = 3, last_error = 'no route', "
            "created_at = now() - interval '10 minutes' WHERE id = %s",
            (ids[0],),
        )
        conn.commit()
    health = await health_of(store)
    assert (health.unordered_failing, health.unordered_max_attempts) == (1, 3)
    assert health.unordered_last_error == "no route"
    assert health.oldest_due_age_seconds >= 600
    assert len(health.warnings) == 2


async def test_status_shows_the_health(store: StoreSettings) -> None:
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        status = await read_status(conn, store)
    text = render(status)
    assert "health: oldest due row" in text and "orders_outbox" in text
    assert "no warnings" in text
    shown = json.loads(json.dumps(asdict(status), default=str))
    assert shown["health"]["warnings"] == []
