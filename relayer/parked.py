"""Operator control of parked keys: list, redrive (send again, in order) and drop.

A change to a parked key first locks its lane's lease row, so it waits for a batch that is in
flight on that lane and can never interleave with one. Redrive wakes idle workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from relayer.schema import require_schema
from relayer.settings import StoreSettings
from relayer.sql import queries_for


@dataclass(frozen=True, slots=True)
class ParkedKey:
    key: str
    lane: int
    attempts: int
    last_error: str
    retry_at: datetime | None
    parked_at: datetime
    head_id: UUID
    pending: int

    @property
    def waiting_for_operator(self) -> bool:
        """True once max_attempts was reached or the error was permanent."""
        return self.retry_at is None


@dataclass(frozen=True, slots=True)
class KeyChange:
    key: str
    rows: int


async def list_parked(
    conn: psycopg.AsyncConnection[Any], store: StoreSettings, key: str | None = None
) -> list[ParkedKey]:
    """Parked keys (or ``key`` alone), oldest first; SchemaNotAppliedError (saying what to
    run) before `schema apply`."""
    await require_schema(conn, store)
    return await read_parked(conn, store, key)


async def read_parked(
    conn: psycopg.AsyncConnection[Any], store: StoreSettings, key: str | None = None
) -> list[ParkedKey]:
    """``list_parked`` for a caller that checked the schema already."""
    cursor = await conn.execute(queries_for(store.names)["parked_list"], {"key": key})
    return [
        ParkedKey(
            key=row[0],
            lane=int(row[1]),
            attempts=int(row[2]),
            last_error=row[3],
            retry_at=row[4],
            parked_at=row[5],
            head_id=row[6],
            pending=int(row[7]),
        )
        for row in await cursor.fetchall()
    ]


async def redrive(
    conn: psycopg.AsyncConnection[Any], store: StoreSettings, key: str | None = None
) -> list[KeyChange]:
    """Unpark ``key`` (or every parked key): its rows are sent again from its head, in order."""
    return await _change(conn, store, key, "redrive_key", notify=True)


async def drop(
    conn: psycopg.AsyncConnection[Any], store: StoreSettings, key: str | None = None
) -> list[KeyChange]:
    """Delete ``key``'s pending rows (or every parked key's) and unpark it. Cannot be undone."""
    return await _change(conn, store, key, "drop_key", notify=False)


async def _change(
    conn: psycopg.AsyncConnection[Any],
    store: StoreSettings,
    key: str | None,
    query: str,
    *,
    notify: bool,
) -> list[KeyChange]:
    queries = queries_for(store.names)
    changes: list[KeyChange] = []
    for parked in await list_parked(conn, store, key):
        async with conn.transaction():
            await conn.execute(queries["lock_lane_for_operator"], {"lane": parked.lane})
            cursor = await conn.execute(queries[query], {"key": parked.key})
            changes.append(KeyChange(parked.key, cursor.rowcount))
            if notify:
                await conn.execute(queries["notify"], (store.names.notify_channel,))
    return changes
