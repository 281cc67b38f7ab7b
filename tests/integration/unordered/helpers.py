"""Helpers for the unordered tests: a store with a memory transport, outbox rows by id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

import psycopg

from relayer.settings import StoreSettings
from tests.conftest import apply_schema, make_store


async def memory_store(dsn: str, **overrides: Any) -> StoreSettings:
    values: dict[str, Any] = {
        "transports": {"memory": {"type": "memory"}},
        "default_transport": "memory",
        "retry_backoff": "0.5s",
        "retry_backoff_max": "1h",
    }
    values.update(overrides)
    store = make_store(dsn, **values)
    await apply_schema(store)
    return store


def rows(store: StoreSettings) -> dict[UUID, tuple[Any, ...]]:
    """id -> (attempts, last_error, seconds until deliver_at or None) of every outbox row."""
    with psycopg.connect(store.require_dsn()) as conn:
        found = conn.execute(
            f"SELECT id, attempts, last_error, extract(epoch FROM deliver_at - now())::float8 "
            f"FROM {store.table_prefix}outbox"
        ).fetchall()
    return {row[0]: tuple(row[1:]) for row in found}


def backdate(store: StoreSettings, ids: Sequence[UUID], seconds: float = 3600) -> None:
    """Make rows look written ``seconds`` ago (an application that died long ago)."""
    with psycopg.connect(store.require_dsn()) as conn:
        conn.execute(
            f"UPDATE {store.table_prefix}outbox "
            "SET created_at = now() - make_interval(secs => %s) WHERE id = ANY(%s)",
            (seconds, list(ids)),
        )
        conn.commit()
