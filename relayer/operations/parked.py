"""Operator control of parked keys: list, redrive (send again, in order) and drop.

A change to a parked key first locks its lane's lease row, so it waits for a batch that is in
flight on that lane and can never interleave with one. Redrive wakes idle workers.

A change may carry a guard, the head row and attempt count the operator saw: it then applies
only if the key is still parked on that head with that count (otherwise the outcome is
``stale`` and nothing changes). Every change, applied or not, writes an audit row (source,
actor, action, key, rows, reason, outcome) in the same transaction, once the store's schema
has the audit table (version 4). The statements are relayer.store.parked's.
"""

from __future__ import annotations

from dataclasses import dataclass

from relayer.dispatch.control import default_actor
from relayer.operations.schema import require_schema
from relayer.settings import StoreSettings
from relayer.store import parked as statements
from relayer.store.driver import Connection
from relayer.store.parked import (
    ACTIONS,
    APPLIED,
    DROP,
    DROP_HEAD,
    NOT_PARKED,
    REDRIVE,
    STALE,
    Actor,
    Guard,
    KeyOutcome,
    ParkedKey,
    has_audit_table,
    read_parked,
)


@dataclass(frozen=True, slots=True)
class KeyChange:
    key: str
    rows: int


async def list_parked(
    conn: Connection, store: StoreSettings, key: str | None = None
) -> list[ParkedKey]:
    """Parked keys (or ``key`` alone), oldest first; SchemaNotAppliedError (saying what to
    run) before `schema apply`."""
    await require_schema(conn, store)
    return await read_parked(conn, store, key)


async def redrive(
    conn: Connection,
    store: StoreSettings,
    key: str | None = None,
    *,
    actor: Actor | None = None,
    reason: str | None = None,
) -> list[KeyChange]:
    """Unpark ``key`` (or every parked key): its rows are sent again from its head, in order."""
    return await _change_all(conn, store, key, REDRIVE, actor=actor, reason=reason)


async def drop(
    conn: Connection,
    store: StoreSettings,
    key: str | None = None,
    *,
    actor: Actor | None = None,
    reason: str | None = None,
) -> list[KeyChange]:
    """Delete ``key``'s pending rows (or every parked key's) and unpark it. Cannot be undone."""
    return await _change_all(conn, store, key, DROP, actor=actor, reason=reason)


async def change_key(
    conn: Connection,
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

    ``actor`` defaults to the CLI's ``user@host:pid``; ``audited`` says whether the store has
    the audit table (None: look it up)."""
    if action not in ACTIONS:
        raise ValueError(f"action {action!r} is not one of {', '.join(ACTIONS)}")
    who = actor or Actor("cli", default_actor())
    if audited is None:
        audited = await has_audit_table(conn, store)
    return await statements.change_key(
        conn, store, key, action, guard=guard, actor=who, reason=reason, audited=audited
    )


async def _change_all(
    conn: Connection,
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


__all__ = [
    "ACTIONS",
    "APPLIED",
    "DROP",
    "DROP_HEAD",
    "NOT_PARKED",
    "REDRIVE",
    "STALE",
    "Actor",
    "Guard",
    "KeyChange",
    "KeyOutcome",
    "ParkedKey",
    "change_key",
    "drop",
    "has_audit_table",
    "list_parked",
    "read_parked",
    "redrive",
]
