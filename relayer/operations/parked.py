"""Operator control of parked keys: list, redrive (send again, in order) and drop.

A change to a parked key first locks its lane's lease row, so it waits for a batch that is in
flight on that lane and can never interleave with one. Redrive wakes idle workers.

A change may carry a guard, the head row and attempt count the operator saw: it then applies
only if the key is still parked on that head with that count (otherwise the outcome is
``stale`` and nothing changes). Every change, applied or not, writes an audit row (source,
actor, action, key, rows, reason, outcome) in the same transaction, once the store's schema
has the audit table (version 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from relayer.dispatch.control import default_actor
from relayer.operations.schema import require_schema
from relayer.settings import StoreSettings
from relayer.sql import queries_for

REDRIVE = "redrive"
DROP = "drop"  # every pending row of the key
DROP_HEAD = "drop_head"  # the parked head row only
ACTIONS = (REDRIVE, DROP, DROP_HEAD)
_STATEMENTS = {REDRIVE: "redrive_key", DROP: "drop_key", DROP_HEAD: "drop_head_key"}

APPLIED = "applied"
STALE = "stale"  # the key's head or attempts changed since the operator saw them
NOT_PARKED = "not_parked"  # redriven, dropped or delivered meanwhile


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


@dataclass(frozen=True, slots=True)
class Guard:
    """What the operator saw: the change applies only if the key is still parked so."""

    head_id: UUID
    attempts: int


@dataclass(frozen=True, slots=True)
class Actor:
    """Who makes a change, for the audit trail: ``source`` is 'cli' or 'dashboard'."""

    source: str
    name: str


@dataclass(frozen=True, slots=True)
class KeyOutcome:
    key: str
    action: str
    outcome: str  # APPLIED, STALE or NOT_PARKED
    rows: int  # rows sent again (redrive) or deleted (drop)
    lane: int | None
    head_id: UUID | None  # the key's head when the change was decided
    attempts: int | None

    @property
    def applied(self) -> bool:
        return self.outcome == APPLIED


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
    conn: psycopg.AsyncConnection[Any],
    store: StoreSettings,
    key: str | None = None,
    *,
    actor: Actor | None = None,
    reason: str | None = None,
) -> list[KeyChange]:
    """Unpark ``key`` (or every parked key): its rows are sent again from its head, in order."""
    return await _change_all(conn, store, key, REDRIVE, actor=actor, reason=reason)


async def drop(
    conn: psycopg.AsyncConnection[Any],
    store: StoreSettings,
    key: str | None = None,
    *,
    actor: Actor | None = None,
    reason: str | None = None,
) -> list[KeyChange]:
    """Delete ``key``'s pending rows (or every parked key's) and unpark it. Cannot be undone."""
    return await _change_all(conn, store, key, DROP, actor=actor, reason=reason)


async def change_key(
    conn: psycopg.AsyncConnection[Any],
    store: StoreSettings,
    key: str,
    action: str,
    *,
    guard: Guard | None = None,
    actor: Actor | None = None,
    reason: str | None = None,
    audited: bool | None = None,
) -> KeyOutcome:
    """Apply ``action`` (REDRIVE, DROP or DROP_HEAD) to the parked ``key``, if ``guard``
    (when given) still holds, and record it in the audit trail. ``conn`` is autocommit.

    ``audited`` says whether the store has the audit table (None: look it up)."""
    if action not in ACTIONS:
        raise ValueError(f"action {action!r} is not one of {', '.join(ACTIONS)}")
    queries = queries_for(store.names)
    who = actor or Actor("cli", default_actor())
    if audited is None:
        audited = await has_audit_table(conn, store)
    cursor = await conn.execute(queries["parked_key_state"], {"key": key})
    seen = await cursor.fetchone()
    async with conn.transaction():
        if seen is not None:
            await conn.execute(queries["lock_lane_for_operator"], {"lane": seen[0]})
            cursor = await conn.execute(queries["parked_key_state"], {"key": key})
            seen = await cursor.fetchone()
        if seen is None:
            outcome = KeyOutcome(key, action, NOT_PARKED, 0, None, None, None)
        elif guard is not None and (seen[1], int(seen[2])) != (guard.head_id, guard.attempts):
            outcome = KeyOutcome(key, action, STALE, 0, int(seen[0]), seen[1], int(seen[2]))
        else:
            cursor = await conn.execute(queries[_STATEMENTS[action]], {"key": key})
            rows = cursor.rowcount
            outcome = KeyOutcome(key, action, APPLIED, rows, int(seen[0]), seen[1], int(seen[2]))
            if action != DROP:  # the key's remaining rows are due again: wake the workers
                await conn.execute(queries["notify"], (store.names.notify_channel,))
        if audited:
            await conn.execute(
                queries["audit_record"],
                {
                    "source": who.source,
                    "actor": who.name,
                    "action": action,
                    "key": key,
                    "lane": outcome.lane,
                    "head_id": guard.head_id if guard else outcome.head_id,
                    "attempts": guard.attempts if guard else outcome.attempts,
                    "rows": outcome.rows,
                    "reason": reason,
                    "outcome": outcome.outcome,
                },
            )
    return outcome


async def has_audit_table(conn: psycopg.AsyncConnection[Any], store: StoreSettings) -> bool:
    """True once the store's schema has the operator audit table (schema version 4)."""
    names = store.names
    cursor = await conn.execute(
        queries_for(names)["table_exists"], (f'"{names.schema}"."{names.table("audit")}"',)
    )
    row = await cursor.fetchone()
    return bool(row and row[0])


async def _change_all(
    conn: psycopg.AsyncConnection[Any],
    store: StoreSettings,
    key: str | None,
    action: str,
    *,
    actor: Actor | None,
    reason: str | None,
) -> list[KeyChange]:
    audited = await has_audit_table(conn, store)
    changes: list[KeyChange] = []
    for parked in await list_parked(conn, store, key):
        outcome = await change_key(
            conn, store, parked.key, action, actor=actor, reason=reason, audited=audited
        )
        changes.append(KeyChange(parked.key, outcome.rows))
    return changes
