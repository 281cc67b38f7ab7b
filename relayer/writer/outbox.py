"""The writer: outbox rows inserted in the caller's own transaction.

``Outbox.write`` joins whatever transaction the given connection is in and never opens, commits
or retries one. Every message is validated before anything is written (relayer.writer.messages);
a batch is all or nothing. Errors raised by the caller's connection itself (serialization
failures, deadlocks, a lost connection) propagate unchanged, so the application's retry logic
sees them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from relayer.lanes import UNORDERED_LANE
from relayer.operations.schema import StoreMeta, verify_meta
from relayer.pooler import caller_prepare
from relayer.settings import RelayerSettings, StoreSettings
from relayer.sql import queries_for
from relayer.writer.ids import uuid7, uuid7_iter
from relayer.writer.messages import (
    Fields,
    OutboxMessage,
    Row,
    ensure_json_dumpers,
    stamp_sequence_numbers,
    validate,
    validate_all,
)
from relayer.writer.sequences import reserve_async, reserve_sync
from relayer.writer.transactions import (
    async_connection,
    require_transaction,
    sync_connection,
)

# A batch touching more lanes than this sends one "wake every lane" notification instead.
NOTIFY_LANES_MAX = 32
_COPY_TYPES = ("uuid", "int4", "text", "text", "text", "bytea", "jsonb", "timestamptz")
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
        self._queries = queries_for(store.names)
        self._channel = store.names.notify_channel
        self._insert = self._queries["insert_message"]
        self._insert_notify = self._queries["insert_message_notify"]
        self._reserve = self._queries["reserve_sequences"]
        # Behind a transaction pooler no statement of the writer is prepared on the server.
        self._prepare = caller_prepare(store.pooler)
        self._meta: StoreMeta | None = None
        self._meta_lock = threading.Lock()
        # Told (conn, ids) after unordered rows were inserted through conn, so that an
        # after-commit dispatcher (relayer.relay.unordered) can send them once the transaction
        # commits.
        self.on_unordered: Callable[[Any, list[UUID]], None] | None = None

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
        fields = validate(
            self.store, OutboxMessage(destination, body, key, headers, transport, deliver_at)
        )
        connection = sync_connection(conn, _ASYNC_NAMES, _SYNC_NAMES)
        self._verify_sync(connection)
        if self.store.sequence_numbers and fields[1] is not None:
            reserved = reserve_sync(connection, self._reserve, [fields[1]], self._prepare)
            fields = stamp_sequence_numbers([fields], reserved)[0]
        row: Row = (uuid7(), *fields)  # the id after the sequence's lock: same order as numbers
        connection.execute(*self._insert_statement(row), prepare=self._prepare)
        self._remember_unordered(conn, [row])
        return row[0]

    def write_many(self, conn: Any, messages: Iterable[OutboxMessage]) -> list[UUID]:
        """Insert many messages with one COPY in ``conn``'s current transaction; all or none."""
        validated = validate_all(self.store, messages)
        if not validated:
            return []
        connection = sync_connection(conn, _ASYNC_NAMES, _SYNC_NAMES)
        self._verify_sync(connection)
        if self.store.sequence_numbers:
            keys = [fields[1] for fields in validated]
            first = reserve_sync(connection, self._reserve, keys, self._prepare)
            validated = stamp_sequence_numbers(validated, first)
        rows: list[Row] = []
        with connection.cursor() as cursor:
            with cursor.copy(self._queries["copy_messages"]) as copy:
                copy.set_types(_COPY_TYPES)
                for row in _streamed(validated, rows):
                    copy.write_row(row)
            if self._wakes_workers(rows):
                cursor.execute(*self._notify_statement(rows), prepare=self._prepare)
        self._remember_unordered(conn, rows)
        return [row[0] for row in rows]

    def _wakes_workers(self, rows: Sequence[Row]) -> bool:
        """Only ordered rows wake the workers; unordered ones are sent after the commit."""
        return self.store.notify and any(row[1] != UNORDERED_LANE for row in rows)

    def _insert_statement(self, row: Row) -> tuple[str, Sequence[object]]:
        if self._wakes_workers([row]):
            return self._insert_notify, (*row, self._channel, str(row[1]))
        return self._insert, row

    def _notify_statement(self, rows: Sequence[Row]) -> tuple[str, Sequence[object]]:
        """One notification per lane written (a worker wakes just those lanes), or a single
        empty one, meaning "every lane", when a batch spans many lanes."""
        lanes = sorted({row[1] for row in rows if row[1] != UNORDERED_LANE})
        if len(lanes) > NOTIFY_LANES_MAX:
            return self._queries["notify"], (self._channel,)
        return self._queries["notify_lanes"], (self._channel, lanes)

    def _verify_sync(self, connection: psycopg.Connection[Any]) -> None:
        require_transaction(connection, "outbox row")
        ensure_json_dumpers(connection.adapters)
        if self._meta is not None:
            return
        with self._meta_lock:
            exists = connection.execute(
                self._queries["table_exists"], (_regclass(self.store),), prepare=self._prepare
            )
            found = exists.fetchone()
            meta = None
            if found and found[0]:
                row = connection.execute(
                    self._queries["read_meta"], prepare=self._prepare
                ).fetchone()
                meta = StoreMeta(int(row[0]), int(row[1])) if row else None
            self._meta = verify_meta(self.store, meta)

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
        fields = validate(
            self.store, OutboxMessage(destination, body, key, headers, transport, deliver_at)
        )
        connection = await async_connection(conn, _SYNC_NAMES, _ASYNC_NAMES)
        await self._verify_async(connection)
        if self.store.sequence_numbers and fields[1] is not None:
            first = await reserve_async(connection, self._reserve, [fields[1]], self._prepare)
            fields = stamp_sequence_numbers([fields], first)[0]
        row: Row = (uuid7(), *fields)  # the id after the sequence's lock: same order as numbers
        await connection.execute(*self._insert_statement(row), prepare=self._prepare)
        self._remember_unordered(conn, [row])
        return row[0]

    async def write_many_async(self, conn: Any, messages: Iterable[OutboxMessage]) -> list[UUID]:
        """Insert many messages with one COPY in ``conn``'s current transaction; all or none."""
        validated = validate_all(self.store, messages)
        if not validated:
            return []
        connection = await async_connection(conn, _SYNC_NAMES, _ASYNC_NAMES)
        await self._verify_async(connection)
        if self.store.sequence_numbers:
            keys = [fields[1] for fields in validated]
            first = await reserve_async(connection, self._reserve, keys, self._prepare)
            validated = stamp_sequence_numbers(validated, first)
        rows: list[Row] = []
        async with connection.cursor() as cursor:
            async with cursor.copy(self._queries["copy_messages"]) as copy:
                copy.set_types(_COPY_TYPES)
                for row in _streamed(validated, rows):
                    await copy.write_row(row)
            if self._wakes_workers(rows):
                await cursor.execute(*self._notify_statement(rows), prepare=self._prepare)
        self._remember_unordered(conn, rows)
        return [row[0] for row in rows]

    async def _verify_async(self, connection: psycopg.AsyncConnection[Any]) -> None:
        require_transaction(connection, "outbox row")
        ensure_json_dumpers(connection.adapters)
        if self._meta is not None:
            return
        exists = await connection.execute(
            self._queries["table_exists"], (_regclass(self.store),), prepare=self._prepare
        )
        found = await exists.fetchone()
        meta = None
        if found and found[0]:
            cursor = await connection.execute(self._queries["read_meta"], prepare=self._prepare)
            row = await cursor.fetchone()
            meta = StoreMeta(int(row[0]), int(row[1])) if row else None
        self._meta = verify_meta(self.store, meta)


# -- helpers -----------------------------------------------------------------------------------


def _regclass(store: StoreSettings) -> str:
    # Both parts are validated plain identifiers; the string is a bound value for to_regclass.
    return f'"{store.db_schema}"."{store.names.table("meta")}"'


def _streamed(validated: list[Fields], written: list[Row]) -> Iterator[Row]:
    """Rows with their ids, made while the COPY streams: making ids then overlaps with the
    server's work on the rows already sent. Each row is also appended to ``written``."""
    for message_id, fields in zip(uuid7_iter(len(validated)), validated, strict=True):
        row: Row = (message_id, *fields)
        written.append(row)
        yield row
