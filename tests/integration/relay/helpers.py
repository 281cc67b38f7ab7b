"""Helpers for relay tests: writing rows, reading the outbox and parked keys."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from relayer import Outbox, OutboxMessage, lane_for
from relayer.settings import StoreSettings
from relayer.transports.base import OutgoingMessage

# The settings of the stores that one-batch-at-a-time tests send from (four lanes, short
# lease, at most three attempts).
BATCH_STORE: dict[str, Any] = {
    "lanes": 4,
    "batch_size": 50,
    "lease_duration": "4s",
    "poll_interval": "0.2s",
    "retry_backoff": "1s",
    "max_attempts": 3,
}


def keys_in_lane(store: StoreSettings, lane: int, count: int, prefix: str = "key") -> list[str]:
    """``count`` distinct keys that hash to ``lane``."""
    found: list[str] = []
    number = 0
    while len(found) < count:
        key = f"{prefix}-{number}"
        if lane_for(key, store.lanes) == lane:
            found.append(key)
        number += 1
    return found


def write(
    store: StoreSettings,
    keys: Iterable[str],
    per_key: int = 1,
    *,
    destination: str = "events",
    transport: str | None = None,
    deliver_at: datetime | None = None,
) -> list[UUID]:
    """Rows for each key, interleaved (k0#0, k1#0, ..., k0#1, ...), in one transaction."""
    keys = list(keys)
    messages = [
        OutboxMessage(
            destination,
            f"{key}#{number}".encode(),
            key=key,
            transport=transport,
            deliver_at=deliver_at,
        )
        for number in range(per_key)
        for key in keys
    ]
    with psycopg.connect(store.require_dsn()) as conn:
        ids = Outbox(store).write_many(conn, messages)
        conn.commit()
    return ids


def pending(store: StoreSettings) -> int:
    """The rows not sent yet (partitioned storage: held rows, rows above progress, and rows
    whose transaction the lane's progress snapshot did not see)."""
    prefix = store.table_prefix
    query = f"SELECT count(*) FROM {prefix}outbox"
    if store.storage == "partitioned":
        query = (
            f"SELECT (SELECT count(*) FROM {prefix}held) + (SELECT count(*) FROM {prefix}outbox "
            f"AS o JOIN {prefix}progress AS g ON g.lane = o.lane WHERE o.id > g.done_id "
            "OR NOT pg_visible_in_snapshot(o.xid, g.snap))"
        )
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def parked(store: StoreSettings) -> dict[str, tuple[Any, ...]]:
    """ordering_key -> (attempts, last_error, retry_at is null)."""
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute(
            f"SELECT ordering_key, attempts, last_error, retry_at IS NULL "
            f"FROM {store.table_prefix}parked"
        ).fetchall()
    return {row[0]: tuple(row[1:]) for row in rows}


def park(store: StoreSettings, key: str, error: str = "refused") -> tuple[Any, int]:
    """Park ``key`` on its head row as the relay would (attempts 1, waiting for an operator)."""
    write(store, [key], per_key=2)
    with psycopg.connect(store.require_dsn()) as conn:
        head = conn.execute(
            f"SELECT id, lane FROM {store.table_prefix}outbox WHERE ordering_key = %s "
            "ORDER BY id LIMIT 1",
            (key,),
        ).fetchone()
        assert head is not None
        conn.execute(
            f"INSERT INTO {store.table_prefix}parked (ordering_key, lane, head_id, attempts, "
            "last_error, retry_at) VALUES (%s, %s, %s, 1, %s, NULL)",
            (key, head[1], head[0], error),
        )
    return head[0], 1


def bodies_by_key(messages: Sequence[OutgoingMessage]) -> dict[str, list[int]]:
    """key -> the sequence numbers received for it, in arrival order."""
    result: dict[str, list[int]] = {}
    for message in messages:
        key, number = message.body.decode().rsplit("#", 1)
        result.setdefault(key, []).append(int(number))
    return result


def first_deliveries_in_order(messages: Sequence[OutgoingMessage]) -> bool:
    """I2: per key, the first delivery of each message appears in id order."""
    seen: set[UUID] = set()
    last: dict[str | None, UUID] = {}
    for message in messages:
        if message.id in seen:
            continue
        seen.add(message.id)
        previous = last.get(message.key)
        if previous is not None and message.id < previous:
            return False
        last[message.key] = message.id
    return True
