"""Operator controls of a store's queues: pause, resume, concurrency limits, status, audit.

Also what every user of the queue tables shares: the schema version they need and the advisory
lock key of a queue's slots.

Every change is one statement that updates the queue's current state and appends an audit row
(who, when, why, what), so the two never disagree. Workers read the state on their next claim.
``who`` defaults to ``user@host:pid`` of the calling process.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from relayer.dispatch.policies import ALL_QUEUES, InvalidDispatchError, check_queue_name
from relayer.errors import ConfigurationError, DispatchError, SchemaNotAppliedError
from relayer.identifiers import StoreNames
from relayer.lanes import fnv1a_32
from relayer.settings import StoreSettings
from relayer.store.dispatch import QueueStatements
from relayer.store.driver import Connection, connect, translated
from relayer.store.schema import read_meta, verify_meta

DISPATCH_SCHEMA_VERSION = 2  # the migration that created the queue tables (0002_dispatch)
CLAIM_SCHEMA_VERSION = 5  # the migration that created the claim function (0005_claim_function)
MAX_LIMIT = 2**31 - 1  # the queue table's integer column
LIMIT_RULE = (
    f"must be an integer from 1 to {MAX_LIMIT:,}, or None ('none' on the command line) to "
    "remove the limit"
)


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """A queue's cluster-wide state. The queue ``*`` is the pause of every queue."""

    queue: str
    paused: bool  # by its own pause (see also the '*' entry)
    changed_by: str | None  # who paused or resumed it last, when and why
    changed_at: datetime | None
    reason: str | None
    limit: int | None
    slots_in_use: int | None  # jobs holding a slot now; None when the queue has no limit


@dataclass(frozen=True, slots=True)
class QueueEvent:
    id: int
    queue: str
    action: str  # 'pause', 'resume' or 'limit'
    actor: str
    reason: str | None
    limit: int | None
    occurred_at: datetime


def default_actor() -> str:
    """``user@host:pid``: who made a change when the caller does not say."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


def queue_lock_key(names: StoreNames, queue: str) -> int:
    """The first key of a queue's slot locks: stable, positive, distinct per store and queue.

    Advisory locks are per database, so only queues of stores in one database share the key
    space; a collision between two of them (odds ~1 in 2**31 per pair) would make them share
    slots, which lowers concurrency but never lets a queue exceed its limit.
    """
    text = f"{names.schema}.{names.prefix}queues/{queue}"
    return fnv1a_32(text.encode("utf-8")) & 0x7FFF_FFFF


async def require_dispatch_schema(
    conn: Connection,
    store: StoreSettings,
    version: int = DISPATCH_SCHEMA_VERSION,
) -> None:
    """Refuse a store whose schema predates the queue tables (or ``version``: the claim
    function, for a dispatcher), or was never applied."""
    meta = await read_meta(conn, store.names)
    if meta is None:
        verify_meta(store, meta)  # raises SchemaNotAppliedError, saying what to run
        return
    where = f"in schema {store.db_schema!r} with prefix {store.table_prefix!r}"
    if meta.schema_version < version:
        if version > DISPATCH_SCHEMA_VERSION:  # a dispatcher: the same words as the worker's
            verify_meta(store, meta)
        raise SchemaNotAppliedError(
            f"store {store.name!r}: schema version {meta.schema_version} {where}; the queue "
            f"tables need version {version}: run `relayer schema apply {store.name}`"
        )


def check_limit(limit: object) -> int | None:
    """A concurrency limit: an integer from 1 to MAX_LIMIT, or None for none. Anything else is
    rejected (ConfigurationError)."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigurationError("limit", limit, LIMIT_RULE)
    return limit


def _queue_name(queue: object) -> str:
    try:
        return check_queue_name(queue)
    except InvalidDispatchError as exc:
        raise ConfigurationError("queue", queue, str(exc).rstrip(".")) from None


class QueueControl:
    """Changes and reads the queue state of one store through ``conn``.

    Each change is a single statement: atomic on an autocommit connection, and part of the
    caller's transaction otherwise (visible to workers once the caller commits).
    """

    def __init__(self, conn: Connection, names: StoreNames) -> None:
        self._conn = conn
        self._names = names
        self._statements = QueueStatements(names)

    async def pause(
        self, queue: str | None = None, *, reason: str | None = None, by: str | None = None
    ) -> None:
        """Pause ``queue`` (every queue of the store when None) on every node's next claim."""
        await self._set_pause(queue, True, reason, by)

    async def resume(
        self, queue: str | None = None, *, reason: str | None = None, by: str | None = None
    ) -> None:
        """Resume ``queue``; None lifts the pause of every queue (own pauses stay in force)."""
        await self._set_pause(queue, False, reason, by)

    async def set_limit(
        self,
        queue: str,
        limit: int | None,
        *,
        reason: str | None = None,
        by: str | None = None,
    ) -> None:
        """Cap how many jobs of ``queue`` run at once across the cluster (None: no cap)."""
        params = {
            "queue": _queue_name(queue),
            "limit": check_limit(limit),
            "actor": by or default_actor(),
            "reason": reason,
        }
        await self._statements.set_limit(self._conn, params)

    async def status(self, queues: Iterable[str] = ()) -> tuple[QueueStatus, ...]:
        """Every queue with a stored state, plus ``queues`` (defaults for those without)."""
        rows = {row[0]: row for row in await self._statements.states(self._conn)}
        for queue in queues:
            rows.setdefault(_queue_name(queue), (queue, False, None, None, None, None))
        keys = {queue: queue_lock_key(self._names, queue) for queue in rows}
        in_use = dict(await self._statements.slots_in_use(self._conn, list(keys.values())))
        ordered = sorted(rows, key=lambda queue: (queue != ALL_QUEUES, queue))
        return tuple(
            QueueStatus(
                queue=queue,
                paused=bool(rows[queue][1]),
                changed_by=rows[queue][2],
                changed_at=rows[queue][3],
                reason=rows[queue][4],
                limit=rows[queue][5],
                slots_in_use=None if rows[queue][5] is None else in_use.get(keys[queue], 0),
            )
            for queue in ordered
        )

    async def events(self, queue: str | None = None, limit: int = 100) -> tuple[QueueEvent, ...]:
        """The latest audit rows, newest first (of one queue, or of all)."""
        rows = await self._statements.events(self._conn, queue, limit)
        return tuple(QueueEvent(*row) for row in rows)

    async def _set_pause(
        self, queue: str | None, paused: bool, reason: str | None, by: str | None
    ) -> None:
        params = {
            "queue": ALL_QUEUES if queue is None else _queue_name(queue),
            "paused": paused,
            "actor": by or default_actor(),
            "reason": reason,
        }
        await self._statements.set_pause(self._conn, params)


async def ensure_limit(store: StoreSettings, limit: int | None, *, by: str, reason: str) -> bool:
    """Make ``limit`` the cluster-wide concurrency limit of ``store``'s queue (its lane scans)
    unless it is already; True when it was changed (one audit row). A connection is opened for
    the change and closed after it; StoreError or DispatchError on failure."""
    async with await connect(store, purpose=f"{store.name}:limit") as conn:
        control = QueueControl(conn, store.names)
        with translated(store, "setting its concurrency limit", DispatchError):
            states = await control.status([store.name])
            current = next(state.limit for state in states if state.queue == store.name)
            if current == check_limit(limit):
                return False
            await control.set_limit(store.name, limit, reason=reason, by=by)
    return True
