"""The statements of operator control of parked keys (relayer.operations.parked, the
dashboard): list the keys, and redrive or drop one under a guard with its audit row.

A change first locks its lane's lease row, so it waits for a batch in flight on that lane and
never interleaves with one; the key's state is read again under that lock, checked against
the guard, changed and audited in one transaction. Statements live in
``relayer/sql/operations.sql``; driver errors become StoreError in the driver's own words.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from relayer.redact import redact
from relayer.settings import StoreSettings
from relayer.sql import Queries, queries_for
from relayer.store.driver import Connection, translated_verbatim

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


async def read_parked(
    conn: Connection, store: StoreSettings, key: str | None = None
) -> list[ParkedKey]:
    """Parked keys (or ``key`` alone), oldest first (the schema checked already)."""
    with translated_verbatim():
        cursor = await conn.execute(
            queries_for(store.names, store.storage)["parked_list"], {"key": key}
        )
        rows = await cursor.fetchall()
    return [
        ParkedKey(
            key=row[0],
            lane=int(row[1]),
            attempts=int(row[2]),
            last_error=redact(row[3]),  # a broker's URL in it may hold a password
            retry_at=row[4],
            parked_at=row[5],
            head_id=row[6],
            pending=int(row[7]),
        )
        for row in rows
    ]


async def has_audit_table(conn: Connection, store: StoreSettings) -> bool:
    """True once the store's schema has the operator audit table (schema version 4)."""
    names = store.names
    with translated_verbatim():
        cursor = await conn.execute(
            queries_for(names)["table_exists"], (f'"{names.schema}"."{names.table("audit")}"',)
        )
        row = await cursor.fetchone()
    return bool(row and row[0])


async def change_key(
    conn: Connection,
    store: StoreSettings,
    key: str,
    action: str,
    *,
    guard: Guard | None,
    actor: Actor,
    reason: str | None,
    audited: bool,
) -> KeyOutcome:
    """Apply ``action`` (one of ACTIONS) to the parked ``key`` if ``guard`` (when given)
    still holds, with an audit row when the store has the table (``audited``).
    ``conn`` is autocommit: the change is one transaction of its own."""
    queries = queries_for(store.names, store.storage)
    with translated_verbatim():
        cursor = await conn.execute(queries["parked_key_state"], {"key": key})
        first_look = await cursor.fetchone()
        async with conn.transaction():
            outcome = await _decide(conn, queries, key, action, guard=guard, first_look=first_look)
            if outcome.applied and action != DROP:  # its remaining rows are due: wake workers
                await conn.execute(queries["notify"], (store.names.notify_channel,))
            if audited:
                await conn.execute(
                    queries["audit_record"], _audit_row(outcome, guard, actor, reason)
                )
    return outcome


async def _decide(
    conn: Connection,
    queries: Queries,
    key: str,
    action: str,
    *,
    guard: Guard | None,
    first_look: tuple[Any, ...] | None,
) -> KeyOutcome:
    """The change of ``key`` inside its transaction: if it was parked at the first look, its
    lane locked and its state read again; then the guard checked and the statement run."""
    seen = first_look
    if seen is not None:
        await conn.execute(queries["lock_lane_for_operator"], {"lane": seen[0]})
        cursor = await conn.execute(queries["parked_key_state"], {"key": key})
        seen = await cursor.fetchone()
    if seen is None:
        return KeyOutcome(key, action, NOT_PARKED, 0, None, None, None)
    lane, head_id, attempts = int(seen[0]), seen[1], int(seen[2])
    if guard is not None and (head_id, attempts) != (guard.head_id, guard.attempts):
        return KeyOutcome(key, action, STALE, 0, lane, head_id, attempts)
    cursor = await conn.execute(queries[_STATEMENTS[action]], {"key": key})
    return KeyOutcome(key, action, APPLIED, cursor.rowcount, lane, head_id, attempts)


def _audit_row(
    outcome: KeyOutcome, guard: Guard | None, actor: Actor, reason: str | None
) -> dict[str, Any]:
    """The audit row's values: the guard the operator saw, else the state the change found."""
    return {
        "source": actor.source,
        "actor": actor.name,
        "action": outcome.action,
        "key": outcome.key,
        "lane": outcome.lane,
        "head_id": guard.head_id if guard else outcome.head_id,
        "attempts": guard.attempts if guard else outcome.attempts,
        "rows": outcome.rows,
        "reason": reason,
        "outcome": outcome.outcome,
    }
