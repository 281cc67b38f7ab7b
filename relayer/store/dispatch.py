"""The statements of the dispatch layer (relayer.dispatch): queue slots claimed and unlocked on
a dispatcher connection, and the queue controls' changes and reads.

The SQL is in relayer/sql/dispatch.sql. The cluster state (relayer.dispatch.postgres) keeps
the slots' bookkeeping and decides what a failure means; here a failed statement on the
dispatcher connection raises :class:`SlotStatementError`, with the driver's message as is
(the dispatch layer words it for its callers). A store's schema check and the queue controls
run on connections the caller holds and raise what the driver raises, as before.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, LiteralString

import psycopg
from psycopg.pq import TransactionStatus

from relayer.errors import StoreError
from relayer.identifiers import StoreNames
from relayer.sql import queries_for
from relayer.store import wire
from relayer.store.driver import Connection

# A claim's row: (position in the wanted order, queue index, slot number or None, queue state
# ('granted', 'paused', 'full', ...), the queue's limit).
ClaimRow = tuple[int, int, int | None, str, int | None]
# A queue's stored state: (queue, paused, changed by, changed at, reason, limit).
QueueRow = tuple[str, bool, str | None, datetime | None, str | None, int | None]
# An audit row: (id, queue, action, actor, reason, limit, occurred at).
EventRow = tuple[int, str, str, str, str | None, int | None, datetime]


class SlotStatementError(StoreError):
    """A statement on a dispatcher connection failed; its text is the driver's message and
    the driver's error is its cause."""


@contextlib.contextmanager
def _reported() -> Iterator[None]:
    try:
        yield
    except psycopg.Error as exc:
        raise SlotStatementError(str(exc)) from exc


def usable(conn: Connection) -> bool:
    """Whether statements can still be sent on ``conn`` (neither closed nor broken)."""
    return not conn.closed and not conn.broken


def in_transaction(conn: Connection) -> bool:
    """Whether ``conn`` has a transaction open (or in error)."""
    return conn.info.transaction_status != TransactionStatus.IDLE


def backend_pid(conn: Connection) -> int | None:
    """The server process of ``conn`` (its locks show under this pid), None once closed."""
    return None if conn.closed else int(conn.info.backend_pid)


class SlotStatements:
    """The statements of one store's queue slots on a dispatcher connection.

    ``pinned`` (behind a transaction pooler): a statement that takes or releases slots runs
    inside the connection's transaction (begun if none is open) under a savepoint, in one
    round trip; :meth:`unpin` ends that transaction once no slot is held.
    """

    def __init__(self, names: StoreNames, *, pinned: bool) -> None:
        self.queries = queries_for(names)
        self.pinned = pinned
        self._claim = wire.Statement("queue_claim", self.queries["queue_claim"])

    async def claim(
        self,
        conn: Connection,
        queues: Sequence[str],
        keys: Sequence[int],
        *,
        wanted: Sequence[int],
        budget: int,
        held: Sequence[tuple[int, int]],
        releases: Sequence[tuple[int, int]],
    ) -> list[ClaimRow]:
        """Run the claim function over ``queues`` (their lock ``keys``): unlock ``releases``,
        keep ``held``, and take at most ``budget`` slots in the ``wanted`` order (queue
        positions, from 1). Slots are ``(lock key, slot number)`` pairs."""
        params = {
            "queues": json.dumps(list(queues)),
            "keys": wire.text_list(keys),
            "wanted": wire.text_list(wanted),
            "budget": budget,
            "held_keys": wire.text_list(pair[0] for pair in held),
            "held_slots": wire.text_list(pair[1] for pair in held),
            "release_keys": wire.text_list(pair[0] for pair in releases),
            "release_slots": wire.text_list(pair[1] for pair in releases),
        }
        with _reported():
            if not self.pinned:
                # A pass per batch transaction: the short path to the wire (relayer.store.wire)
                # costs the client about half of psycopg's execute (73-97 µs of CPU a round trip
                # against 170-177, idle machine).
                results = await wire.run(conn, [wire.Command(self._claim, params)])
                return results.rows(0)
            cursor = await self._run(conn, self.queries["queue_claim"], params)
            return await cursor.fetchall()

    async def unlock(self, conn: Connection, pairs: Sequence[tuple[int, int]]) -> None:
        """Unlock the slots ``(lock key, slot number)``."""
        with _reported():
            await self._run(
                conn,
                self.queries["queue_unlock_slots"],
                ([pair[0] for pair in pairs], [pair[1] for pair in pairs]),
            )

    async def unpin(self, conn: Connection) -> None:
        """Release every lock of the session and end its transaction: nothing of this client
        stays on the server connection the pooler lends to the next one."""
        if not in_transaction(conn):
            return
        with _reported():
            async with conn.pipeline():
                await conn.execute(self.queries["queue_unlock_all"])
                await conn.execute(self.queries["queue_commit"])

    async def release_all(self, conn: Connection) -> None:
        """Unlock every slot of the session before it closes (pinned: and end its
        transaction), so that the slots are free before the server ends its process."""
        if self.pinned:
            await self.unpin(conn)
            return
        with _reported():
            await conn.execute(self.queries["queue_unlock_all"])

    async def own_slot_locks(self, conn: Connection, keys: list[int]) -> list[tuple[int, int]]:
        """The slot locks of ``keys`` the session holds, after a failed statement (whose
        savepoint is rolled back first when the transaction is in error)."""
        with _reported():
            if conn.info.transaction_status == TransactionStatus.INERROR:
                # Only pinned statements run in a transaction, each under the savepoint.
                await conn.execute(self.queries["queue_claim_savepoint_rollback"])
            cursor = await conn.execute(self.queries["queue_own_slot_locks"], (keys,))
            return [(int(key), int(slot)) for key, slot in await cursor.fetchall()]

    @contextlib.asynccontextmanager
    async def savepoint(self, conn: Connection) -> AsyncIterator[None]:
        """The block (a store's schema check) under a savepoint of the open transaction: if it
        fails, the transaction is rolled back to the savepoint and stays usable."""
        await conn.execute(self.queries["queue_check_savepoint"])
        try:
            yield
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                await conn.execute(self.queries["queue_check_savepoint_rollback"])
            raise
        await conn.execute(self.queries["queue_check_savepoint_release"])

    async def _run(
        self, conn: Connection, query: LiteralString, params: Any
    ) -> psycopg.AsyncCursor[Any]:
        """One statement that may take or release slot locks; pinned: inside the transaction
        (begun if none is open) and under the savepoint, in one round trip."""
        if not self.pinned:
            return await conn.execute(query, params)
        async with conn.pipeline():
            if not in_transaction(conn):
                await conn.execute(self.queries["queue_begin"])
            await conn.execute(self.queries["queue_claim_savepoint"])
            cursor = await conn.execute(query, params)
            await conn.execute(self.queries["queue_claim_savepoint_release"])
        return cursor


class QueueStatements:
    """The queue controls' statements (relayer.dispatch.control) of one store, on the
    caller's connection: each change is a single statement."""

    def __init__(self, names: StoreNames) -> None:
        self.queries = queries_for(names)

    async def set_pause(self, conn: Connection, params: Mapping[str, Any]) -> None:
        """Pause or resume a queue and record who, when and why (queue, paused, actor,
        reason)."""
        await conn.execute(self.queries["queue_set_pause"], params)

    async def set_limit(self, conn: Connection, params: Mapping[str, Any]) -> None:
        """Set or lift a queue's limit and record it (queue, limit, actor, reason)."""
        await conn.execute(self.queries["queue_set_limit"], params)

    async def states(self, conn: Connection) -> list[QueueRow]:
        """Every queue with a stored state, the '*' pause first."""
        cursor = await conn.execute(self.queries["queue_states"])
        return await cursor.fetchall()

    async def slots_in_use(self, conn: Connection, keys: list[int]) -> list[tuple[int, int]]:
        """(lock key, slot locks held in the database now) of ``keys`` (those without any are
        left out)."""
        cursor = await conn.execute(self.queries["queue_slots_in_use"], (keys,))
        return [(int(key), int(count)) for key, count in await cursor.fetchall()]

    async def events(self, conn: Connection, queue: str | None, limit: int) -> list[EventRow]:
        """The latest audit rows, newest first (of one queue, or of all)."""
        cursor = await conn.execute(
            self.queries["queue_event_log"], {"queue": queue, "limit": limit}
        )
        return await cursor.fetchall()
