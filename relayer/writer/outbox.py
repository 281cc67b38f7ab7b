"""The writer: outbox rows inserted in the caller's own transaction.

``Outbox.write`` joins whatever transaction the given connection is in and never opens, commits
or retries one. Every message is validated before anything is written (relayer.writer.messages);
a batch is all or nothing. The statements are the gateway's (relayer.store.outbox), run on the
psycopg connection behind what the caller passes (relayer.store.caller). Errors raised by the
caller's connection itself (serialization failures, deadlocks, a lost connection) propagate
unchanged, so the application's retry logic sees them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from relayer.lanes import UNORDERED_LANE
from relayer.settings import RelayerSettings, StoreSettings
from relayer.store.caller import async_connection, sync_connection
from relayer.store.notifier import Wake
from relayer.store.outbox import OutboxStatements, Row
from relayer.writer.messages import (
    OutboxMessage,
    stamp_sequence_numbers,
    validate_all,
    validate_fields,
)
from relayer.writer.waker import Waker, waker_for

_SYNC_NAMES = "write / write_many"
_ASYNC_NAMES = "write_async / write_many_async"


class Outbox:
    """Writes outbox rows for one store inside the caller's transaction.

    ``conn`` may be a psycopg ``Connection`` or ``AsyncConnection``, or an SQLAlchemy
    ``Session``, ``Connection``, ``AsyncSession`` or ``AsyncConnection`` using the psycopg
    driver. The store's recorded lane count is checked once per Outbox, on its first write.
    """

    def __init__(self, store: StoreSettings) -> None:
        self.store = store
        self._statements = OutboxStatements(store, stamp_sequence_numbers)
        # Told (conn, ids) after unordered rows were inserted through conn, so that an
        # after-commit dispatcher (relayer.relay.unordered) can send them once the transaction
        # commits.
        self.on_unordered: Callable[[Any, list[UUID]], None] | None = None
        # notify = "after_commit": the workers are woken after the caller's commit, from a
        # connection of relayer's own to the store's database (relayer.writer.waker, one per
        # process and database), started on the first write.
        self._wakes_after_commit = store.notify == "after_commit"
        self._channel = store.names.notify_channel
        self._waker: Waker | None = None

    @property
    def waker(self) -> Waker:
        """What wakes the workers after the caller's commits (``notify = "after_commit"``)."""
        if self._waker is None:
            self._waker = waker_for(self.store)
        return self._waker

    def flush(self) -> None:
        """Send now the wake-ups of the transactions that have ended (they go out within about
        a millisecond anyway; a process about to exit sends what waits on its own)."""
        if self._waker is not None:
            self._waker.flush()

    @classmethod
    def from_settings(cls, settings: RelayerSettings, store: str) -> Outbox:
        """The Outbox of the named store (a ConfigurationError if it is not configured)."""
        return cls(settings.store(store))

    def __repr__(self) -> str:
        return f"Outbox(store={self.store.name!r}, lanes={self.store.lanes})"

    def _remember_unordered(self, conn: Any, rows: Sequence[Row]) -> None:
        if self.on_unordered is not None:
            ids = [row[0] for row in rows if row[2] is None]
            if ids:
                self.on_unordered(conn, ids)

    # -- sync ------------------------------------------------------------------------------

    def write(
        self,
        conn: Any,
        *,
        destination: str,
        body: bytes,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        transport: str | None = None,
        deliver_at: datetime | None = None,
    ) -> UUID:
        """Insert one message in ``conn``'s current transaction and return its id."""
        fields = validate_fields(
            self.store,
            destination=destination,
            body=body,
            key=key,
            headers=headers,
            transport=transport,
            deliver_at=deliver_at,
        )
        connection = sync_connection(conn, _ASYNC_NAMES, _SYNC_NAMES)
        row = self._statements.insert(connection, fields)
        if row[1] != UNORDERED_LANE:
            if self._wakes_after_commit:
                (self._waker or self.waker).written(connection, {(self._channel, row[1])})
        elif self.on_unordered is not None:
            self.on_unordered(conn, [row[0]])
        return row[0]

    def write_many(self, conn: Any, messages: Iterable[OutboxMessage]) -> list[UUID]:
        """Insert many messages with one COPY in ``conn``'s current transaction; all or none."""
        validated = validate_all(self.store, messages)
        if not validated:
            return []
        connection = sync_connection(conn, _ASYNC_NAMES, _SYNC_NAMES)
        rows = self._statements.insert_many(connection, validated)
        if self._wakes_after_commit:
            lanes = self._ordered_lanes(rows)
            if lanes:
                self.waker.written(connection, lanes)
        self._remember_unordered(conn, rows)
        return [row[0] for row in rows]

    # -- async -----------------------------------------------------------------------------

    async def write_async(
        self,
        conn: Any,
        *,
        destination: str,
        body: bytes,
        key: str | None = None,
        headers: Mapping[str, str] | None = None,
        transport: str | None = None,
        deliver_at: datetime | None = None,
    ) -> UUID:
        """Insert one message in ``conn``'s current transaction and return its id."""
        fields = validate_fields(
            self.store,
            destination=destination,
            body=body,
            key=key,
            headers=headers,
            transport=transport,
            deliver_at=deliver_at,
        )
        connection = await async_connection(conn, _SYNC_NAMES, _ASYNC_NAMES)
        row = await self._statements.insert_async(connection, fields)
        if row[1] != UNORDERED_LANE:
            if self._wakes_after_commit:
                (self._waker or self.waker).written_async(connection, {(self._channel, row[1])})
        elif self.on_unordered is not None:
            self.on_unordered(conn, [row[0]])
        return row[0]

    async def write_many_async(self, conn: Any, messages: Iterable[OutboxMessage]) -> list[UUID]:
        """Insert many messages with one COPY in ``conn``'s current transaction; all or none."""
        validated = validate_all(self.store, messages)
        if not validated:
            return []
        connection = await async_connection(conn, _SYNC_NAMES, _ASYNC_NAMES)
        rows = await self._statements.insert_many_async(connection, validated)
        if self._wakes_after_commit:
            lanes = self._ordered_lanes(rows)
            if lanes:
                self.waker.written_async(connection, lanes)
        self._remember_unordered(conn, rows)
        return [row[0] for row in rows]

    def _ordered_lanes(self, rows: Sequence[Row]) -> set[Wake]:
        """The wake-ups of the ordered rows of ``rows`` (unordered ones wake no worker)."""
        channel = self._channel
        return {(channel, row[1]) for row in rows if row[1] != UNORDERED_LANE}
