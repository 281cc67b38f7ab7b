"""The writer's statements (relayer.writer.outbox): outbox rows inserted on the application's
connection, in its transaction, sync and async; nothing here opens, commits or retries one.

One call per write does everything the write needs on the connection: it refuses an
autocommit connection outside a transaction (relayer.store.caller), teaches the connection the
headers' JSON (:class:`~relayer.writer.messages.EncodedJson`), checks the store's recorded
lane count once per store, reserves the keys' sequence numbers when the store sets
``sequence_numbers`` (relayer.writer.sequences), then inserts the row (``insert_message``, or
``insert_message_notify`` to wake the workers of its lane) or COPYs the rows and notifies
their lanes. Ids are made after the sequence counters' lock, so id order agrees with sequence
order. A store never applied is SchemaNotAppliedError and another lane count
LaneCountMismatchError; any driver error reaches the caller as the driver raised it, like the
caller's own statements in the same transaction (serialization failures, deadlocks, a lost
connection), so that the application's retry logic sees it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.adapt import AdaptersMap, Dumper, PyFormat
from psycopg.pq import Format

from relayer.ids import uuid7, uuid7_iter
from relayer.lanes import UNORDERED_LANE
from relayer.pooler import caller_prepare
from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.store.caller import require_transaction
from relayer.store.schema import StoreMeta, verify_meta

# A batch touching more lanes than this sends one "wake every lane" notification instead.
NOTIFY_LANES_MAX = 32
_COPY_TYPES = ("uuid", "int4", "text", "text", "text", "bytea", "jsonb", "timestamptz")


class EncodedJson:
    """JSON text encoded once in Python and sent to a jsonb column as is (this module's
    dumpers send its bytes)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


# A validated message without its id: (lane, key, transport, destination, body, headers, due).
Fields = tuple[int, str | None, str | None, str, bytes, EncodedJson, datetime | None]
Row = tuple[UUID, int, str | None, str | None, str, bytes, EncodedJson, datetime | None]
# How the writer numbers a batch's keyed rows from the first number reserved for each key
# (relayer.writer.messages.stamp_sequence_numbers): the numbering is the writer's, the counters
# and their locks the gateway's.
Stamp = Callable[[list[Fields], Mapping[str, int]], list[Fields]]


class _EncodedJsonDumper(Dumper):
    format = Format.TEXT

    def dump(self, obj: EncodedJson) -> bytes:
        return obj.data


class _EncodedJsonBinaryDumper(_EncodedJsonDumper):
    format = Format.BINARY

    def dump(self, obj: EncodedJson) -> bytes:
        return b"\x01" + obj.data  # jsonb's binary format: a version byte, then the text


_EncodedJsonDumper.oid = _EncodedJsonBinaryDumper.oid = psycopg.postgres.types["jsonb"].oid


def ensure_json_dumpers(adapters: AdaptersMap) -> None:
    """Teach ``adapters`` to send EncodedJson (new connections inherit the global map)."""
    try:
        adapters.get_dumper(EncodedJson, PyFormat.BINARY)
    except psycopg.ProgrammingError:
        adapters.register_dumper(EncodedJson, _EncodedJsonDumper)
        adapters.register_dumper(EncodedJson, _EncodedJsonBinaryDumper)


ensure_json_dumpers(psycopg.adapters)


class OutboxStatements:
    """The writer's statements for one store (``<prefix>outbox``), on a caller's connection.

    The store's recorded lane count is read on the first write and remembered.
    """

    def __init__(self, store: StoreSettings, stamp: Stamp) -> None:
        self.store = store
        self._stamp = stamp
        self._queries = queries_for(store.names)
        self._channel = store.names.notify_channel
        # A NOTIFY in the application's transaction (the other modes wake after the commit,
        # relayer.writer.waker, or not at all).
        self._in_transaction = store.notify == "in_transaction"
        self._sequence_numbers = store.sequence_numbers
        self._insert = self._queries["insert_message"]
        self._insert_notify = self._queries["insert_message_notify"]
        self._reserve = self._queries["reserve_sequences"]
        # Behind a transaction pooler no statement of the writer is prepared on the server.
        self._prepare = caller_prepare(store.pooler)
        # Both parts are validated plain identifiers; the string is a bound value.
        self._meta_table = f'"{store.db_schema}"."{store.names.table("meta")}"'
        self._meta: StoreMeta | None = None
        self._meta_lock = threading.Lock()
        self._taught: AdaptersMap | None = None  # the adapters of the last connection written on

    def _teach(self, adapters: AdaptersMap) -> None:
        """ensure_json_dumpers, skipped for the adapters it was last done for (an application
        usually writes through the same connection again and again)."""
        if adapters is not self._taught:
            ensure_json_dumpers(adapters)
            self._taught = adapters

    # -- sync ------------------------------------------------------------------------------

    def insert(self, connection: psycopg.Connection[Any], fields: Fields) -> Row:
        """Insert one message's row in ``connection``'s transaction; the row, with its id."""
        self._ready(connection)
        if self._sequence_numbers and fields[1] is not None:
            reserved = self._reserved(connection, [fields[1]])
            fields = self._stamp([fields], reserved)[0]
        row: Row = (uuid7(), *fields)  # the id after the sequence's lock: same order as numbers
        if self._in_transaction and row[1] != UNORDERED_LANE:
            connection.execute(*self._insert_statement(row), prepare=self._prepare)
        else:  # _insert_statement's usual answer, without its call
            connection.execute(self._insert, row, prepare=self._prepare)
        return row

    def insert_many(
        self, connection: psycopg.Connection[Any], validated: list[Fields]
    ) -> list[Row]:
        """Insert the rows of ``validated`` with one COPY in ``connection``'s transaction."""
        self._ready(connection)
        if self.store.sequence_numbers:
            reserved = self._reserved(connection, [fields[1] for fields in validated])
            validated = self._stamp(validated, reserved)
        rows: list[Row] = []
        with connection.cursor() as cursor:
            with cursor.copy(self._queries["copy_messages"]) as copy:
                copy.set_types(_COPY_TYPES)
                for row in _streamed(validated, rows):
                    copy.write_row(row)
            if self._wakes_workers(rows):
                cursor.execute(*self._notify_statement(rows), prepare=self._prepare)
        return rows

    def _ready(self, connection: psycopg.Connection[Any]) -> None:
        """Refuse a connection outside a transaction, teach it EncodedJson, and check the
        store's recorded lane count once per store."""
        if connection.autocommit:  # require_transaction's question, asked only when it can fail
            require_transaction(connection, "outbox row")
        adapters = connection.adapters
        if adapters is not self._taught:
            self._teach(adapters)
        if self._meta is not None:
            return
        with self._meta_lock:
            exists = connection.execute(
                self._queries["table_exists"], (self._meta_table,), prepare=self._prepare
            )
            found = exists.fetchone()
            meta = None
            if found and found[0]:
                row = connection.execute(
                    self._queries["read_meta"], prepare=self._prepare
                ).fetchone()
                meta = StoreMeta(int(row[0]), int(row[1])) if row else None
            self._meta = verify_meta(self.store, meta)

    def _reserved(
        self, connection: psycopg.Connection[Any], keys: Iterable[str | None]
    ) -> dict[str, int]:
        counts = _counts(keys)
        if not counts["keys"]:
            return {}
        rows = connection.execute(self._reserve, counts, prepare=self._prepare).fetchall()
        return _first_numbers(rows, counts)

    # -- async -----------------------------------------------------------------------------

    async def insert_async(self, connection: psycopg.AsyncConnection[Any], fields: Fields) -> Row:
        await self._ready_async(connection)
        if self._sequence_numbers and fields[1] is not None:
            reserved = await self._reserved_async(connection, [fields[1]])
            fields = self._stamp([fields], reserved)[0]
        row: Row = (uuid7(), *fields)  # the id after the sequence's lock: same order as numbers
        await connection.execute(*self._insert_statement(row), prepare=self._prepare)
        return row

    async def insert_many_async(
        self, connection: psycopg.AsyncConnection[Any], validated: list[Fields]
    ) -> list[Row]:
        await self._ready_async(connection)
        if self.store.sequence_numbers:
            reserved = await self._reserved_async(connection, [fields[1] for fields in validated])
            validated = self._stamp(validated, reserved)
        rows: list[Row] = []
        async with connection.cursor() as cursor:
            async with cursor.copy(self._queries["copy_messages"]) as copy:
                copy.set_types(_COPY_TYPES)
                for row in _streamed(validated, rows):
                    await copy.write_row(row)
            if self._wakes_workers(rows):
                await cursor.execute(*self._notify_statement(rows), prepare=self._prepare)
        return rows

    async def _ready_async(self, connection: psycopg.AsyncConnection[Any]) -> None:
        require_transaction(connection, "outbox row")
        self._teach(connection.adapters)
        if self._meta is not None:
            return
        exists = await connection.execute(
            self._queries["table_exists"], (self._meta_table,), prepare=self._prepare
        )
        found = await exists.fetchone()
        meta = None
        if found and found[0]:
            cursor = await connection.execute(self._queries["read_meta"], prepare=self._prepare)
            row = await cursor.fetchone()
            meta = StoreMeta(int(row[0]), int(row[1])) if row else None
        self._meta = verify_meta(self.store, meta)

    async def _reserved_async(
        self, connection: psycopg.AsyncConnection[Any], keys: Iterable[str | None]
    ) -> dict[str, int]:
        counts = _counts(keys)
        if not counts["keys"]:
            return {}
        cursor = await connection.execute(self._reserve, counts, prepare=self._prepare)
        return _first_numbers(await cursor.fetchall(), counts)

    # -- the statements --------------------------------------------------------------------

    def _wakes_workers(self, rows: Sequence[Row]) -> bool:
        """Whether the transaction itself notifies (``notify = "in_transaction"``): only
        ordered rows wake the workers; unordered ones are sent after the commit."""
        return self._in_transaction and any(row[1] != UNORDERED_LANE for row in rows)

    def _insert_statement(self, row: Row) -> tuple[str, Sequence[object]]:
        # _wakes_workers for one row, without a list and a generator on the hot path.
        if self._in_transaction and row[1] != UNORDERED_LANE:
            return self._insert_notify, (*row, self._channel, str(row[1]))
        return self._insert, row

    def _notify_statement(self, rows: Sequence[Row]) -> tuple[str, Sequence[object]]:
        """One notification per lane written (a worker wakes just those lanes), or a single
        empty one, meaning "every lane", when a batch spans many lanes."""
        lanes = sorted({row[1] for row in rows if row[1] != UNORDERED_LANE})
        if len(lanes) > NOTIFY_LANES_MAX:
            return self._queries["notify"], (self._channel,)
        return self._queries["notify_lanes"], (self._channel, lanes)


def _streamed(validated: list[Fields], written: list[Row]) -> Iterator[Row]:
    """Rows with their ids, made while the COPY streams: making ids then overlaps with the
    server's work on the rows already sent. Each row is also appended to ``written``."""
    for message_id, fields in zip(uuid7_iter(len(validated)), validated, strict=True):
        row: Row = (message_id, *fields)
        written.append(row)
        yield row


def _counts(keys: Iterable[str | None]) -> dict[str, list[Any]]:
    """The reserve statement's parameters: each key once, and how many numbers it takes."""
    counts = Counter(key for key in keys if key is not None)
    ordered = sorted(counts)
    return {"keys": ordered, "counts": [counts[key] for key in ordered]}


def _first_numbers(
    returned: Iterable[tuple[Any, ...]], counts: Mapping[str, list[Any]]
) -> dict[str, int]:
    """key -> the first number reserved for it (the counter returns the last)."""
    reserved = dict(zip(counts["keys"], counts["counts"], strict=True))
    return {str(key): int(last) - reserved[key] + 1 for key, last in returned}
