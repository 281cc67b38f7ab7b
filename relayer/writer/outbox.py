"""The writer: outbox rows inserted in the caller's own transaction.

``Outbox.write`` joins whatever transaction the given connection is in and never opens, commits
or retries one. Every message is validated before anything is written; a batch is all or
nothing. Errors raised by the caller's connection itself (serialization failures, deadlocks,
a lost connection) propagate unchanged, so the application's retry logic sees them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.adapt import Dumper, PyFormat
from psycopg.pq import Format

from relayer.errors import InvalidMessageError, Shown
from relayer.lanes import UNORDERED_LANE, lane_for
from relayer.observability.tracing import with_trace_context
from relayer.operations.schema import StoreMeta, verify_meta
from relayer.pooler import caller_prepare
from relayer.settings import RelayerSettings, StoreSettings
from relayer.sql import queries_for
from relayer.transports.base import MESSAGE_ID_HEADER, ORDERING_KEY_HEADER, SEQUENCE_HEADER
from relayer.writer.ids import uuid7, uuid7_block, uuid7_iter
from relayer.writer.sequences import reserve_async, reserve_sync, stamped_json
from relayer.writer.transactions import (
    async_connection,
    require_transaction,
    sync_connection,
)

MAX_KEY_BYTES = 1024
MAX_DESTINATION_BYTES = 1024
MAX_HEADERS_BYTES = 64 * 1024
# A batch touching more lanes than this sends one "wake every lane" notification instead.
NOTIFY_LANES_MAX = 32
MAX_TRANSPORT_NAME = 128
_COPY_TYPES = ("uuid", "int4", "text", "text", "text", "bytea", "jsonb", "timestamptz")
_STAMPED_HEADERS = {
    MESSAGE_ID_HEADER: "the outbox id",
    ORDERING_KEY_HEADER: "the ordering key",
}
_SYNC_NAMES = "write / write_many"
_ASYNC_NAMES = "write_async / write_many_async"


class EncodedJson:
    """JSON text encoded once in Python and sent to a jsonb column as is."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _EncodedJsonDumper(Dumper):
    format = Format.TEXT

    def dump(self, obj: EncodedJson) -> bytes:
        return obj.data


class _EncodedJsonBinaryDumper(_EncodedJsonDumper):
    format = Format.BINARY

    def dump(self, obj: EncodedJson) -> bytes:
        return b"\x01" + obj.data  # jsonb's binary format: a version byte, then the text


_JSONB_OID = psycopg.postgres.types["jsonb"].oid
_EncodedJsonDumper.oid = _EncodedJsonBinaryDumper.oid = _JSONB_OID


def _ensure_json_dumpers(adapters: psycopg.adapt.AdaptersMap) -> None:
    """Teach ``adapters`` to send EncodedJson (new connections inherit the global map)."""
    try:
        adapters.get_dumper(EncodedJson, PyFormat.BINARY)
    except psycopg.ProgrammingError:
        adapters.register_dumper(EncodedJson, _EncodedJsonDumper)
        adapters.register_dumper(EncodedJson, _EncodedJsonBinaryDumper)


_ensure_json_dumpers(psycopg.adapters)


_NO_HEADERS = EncodedJson(b"{}")

# A validated message without its id: (lane, key, transport, destination, body, headers, due).
Fields = tuple[int, str | None, str | None, str, bytes, EncodedJson, datetime | None]
Row = tuple[UUID, int, str | None, str | None, str, bytes, EncodedJson, datetime | None]


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """One message for ``write_many``: the same fields ``write`` takes as arguments."""

    destination: str
    body: bytes
    key: str | None = None
    headers: Mapping[str, str] | None = field(default=None)
    transport: str | None = None
    deliver_at: datetime | None = None


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

    # -- validation -----------------------------------------------------------------------

    def prepare(self, message: OutboxMessage) -> Row:
        """Validate one message and turn it into the row to insert (nothing is written)."""
        return (uuid7(), *self._validate(message))

    def _validate(self, message: OutboxMessage) -> Fields:
        destination = _text("destination", message.destination, MAX_DESTINATION_BYTES)
        if not destination:
            raise InvalidMessageError("destination", destination, "must not be empty")
        body = message.body
        if isinstance(body, bytearray | memoryview):
            body = bytes(body)
        if not isinstance(body, bytes):
            raise InvalidMessageError(
                "body",
                _preview(body),
                f"must be bytes, not {type(body).__name__}; encode it first "
                "(for example body=json.dumps(event).encode())",
            )
        if len(body) > self.store.max_body_bytes:
            raise InvalidMessageError(
                "body",
                Shown(f"<{len(body):,} bytes>"),
                f"is larger than this store's max_body_bytes ({self.store.max_body_bytes:,}); "
                "send less, or raise max_body_bytes (the broker must accept it too)",
            )
        key = message.key
        lane = UNORDERED_LANE
        if key is not None:
            key = _text("key", key, MAX_KEY_BYTES)
            if not key:
                raise InvalidMessageError(
                    "key", key, "must not be empty; use key=None for an unordered message"
                )
            lane = lane_for(key, self.store.lanes)
        transport = self._transport(message.transport)
        headers = _headers(with_trace_context(message.headers))
        deliver_at = message.deliver_at
        if deliver_at is not None:
            if not isinstance(deliver_at, datetime):
                raise InvalidMessageError("deliver_at", deliver_at, "must be a datetime or None")
            if deliver_at.tzinfo is None or deliver_at.utcoffset() is None:
                raise InvalidMessageError(
                    "deliver_at",
                    deliver_at,
                    "must be timezone-aware (for example datetime.now(UTC) + timedelta(...))",
                )
        return (lane, key, transport, destination, body, headers, deliver_at)

    def _transport(self, name: str | None) -> str | None:
        if name is None:
            if self.store.default_transport is None and self.store.transports:
                known = ", ".join(repr(known) for known in self.store.transports)
                raise InvalidMessageError(
                    "transport",
                    None,
                    f"store {self.store.name!r} has no default_transport, so a message must "
                    f"name one of its transports ({known}); pass transport=..., or set "
                    f"stores.{self.store.name}.default_transport",
                )
            return self.store.default_transport
        name = _text("transport", name, MAX_TRANSPORT_NAME)
        if not name:
            raise InvalidMessageError(
                "transport", name, "must not be empty; use None for the default"
            )
        if self.store.transports and name not in self.store.transports:
            known = ", ".join(repr(known) for known in self.store.transports)
            raise InvalidMessageError(
                "transport",
                name,
                f"is not a transport of store {self.store.name!r} (configured: {known}); name "
                "one of them, or configure it in the store's settings",
            )
        return name

    def _prepare_all(self, messages: Iterable[OutboxMessage]) -> list[Row]:
        return _with_ids(self._validate_all(messages))

    def _validate_all(self, messages: Iterable[OutboxMessage]) -> list[Fields]:
        validated: list[Fields] = []
        for index, message in enumerate(messages):
            if not isinstance(message, OutboxMessage):
                raise InvalidMessageError(
                    f"messages[{index}]", type(message).__name__, "must be a relayer.OutboxMessage"
                )
            try:
                validated.append(self._validate(message))
            except InvalidMessageError as exc:
                raise InvalidMessageError(
                    f"messages[{index}].{exc.field}", exc.value, exc.rule
                ) from None
        return validated

    def _stamp(self, validated: list[Fields], first: Mapping[str, int]) -> list[Fields]:
        """Add each keyed row's sequence number header, numbering a key's rows in order."""
        following = dict(first)
        stamped: list[Fields] = []
        for fields in validated:
            lane, key, transport, destination, body, headers, deliver_at = fields
            if key is None:
                stamped.append(fields)
                continue
            number = following[key]
            following[key] = number + 1
            headers = EncodedJson(stamped_json(headers.data, number))
            stamped.append((lane, key, transport, destination, body, headers, deliver_at))
        return stamped

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
        fields = self._validate(
            OutboxMessage(destination, body, key, headers, transport, deliver_at)
        )
        connection = sync_connection(conn, _ASYNC_NAMES, _SYNC_NAMES)
        self._verify_sync(connection)
        if self.store.sequence_numbers and fields[1] is not None:
            reserved = reserve_sync(connection, self._reserve, [fields[1]], self._prepare)
            fields = self._stamp([fields], reserved)[0]
        row: Row = (uuid7(), *fields)  # the id after the sequence's lock: same order as numbers
        connection.execute(*self._insert_statement(row), prepare=self._prepare)
        self._remember_unordered(conn, [row])
        return row[0]

    def write_many(self, conn: Any, messages: Iterable[OutboxMessage]) -> list[UUID]:
        """Insert many messages with one COPY in ``conn``'s current transaction; all or none."""
        validated = self._validate_all(messages)
        if not validated:
            return []
        connection = sync_connection(conn, _ASYNC_NAMES, _SYNC_NAMES)
        self._verify_sync(connection)
        if self.store.sequence_numbers:
            keys = [fields[1] for fields in validated]
            first = reserve_sync(connection, self._reserve, keys, self._prepare)
            validated = self._stamp(validated, first)
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
        _ensure_json_dumpers(connection.adapters)
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
        fields = self._validate(
            OutboxMessage(destination, body, key, headers, transport, deliver_at)
        )
        connection = await async_connection(conn, _SYNC_NAMES, _ASYNC_NAMES)
        await self._verify_async(connection)
        if self.store.sequence_numbers and fields[1] is not None:
            first = await reserve_async(connection, self._reserve, [fields[1]], self._prepare)
            fields = self._stamp([fields], first)[0]
        row: Row = (uuid7(), *fields)  # the id after the sequence's lock: same order as numbers
        await connection.execute(*self._insert_statement(row), prepare=self._prepare)
        self._remember_unordered(conn, [row])
        return row[0]

    async def write_many_async(self, conn: Any, messages: Iterable[OutboxMessage]) -> list[UUID]:
        """Insert many messages with one COPY in ``conn``'s current transaction; all or none."""
        validated = self._validate_all(messages)
        if not validated:
            return []
        connection = await async_connection(conn, _SYNC_NAMES, _ASYNC_NAMES)
        await self._verify_async(connection)
        if self.store.sequence_numbers:
            keys = [fields[1] for fields in validated]
            first = await reserve_async(connection, self._reserve, keys, self._prepare)
            validated = self._stamp(validated, first)
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
        _ensure_json_dumpers(connection.adapters)
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


def _with_ids(validated: list[Fields]) -> list[Row]:
    ids = uuid7_block(len(validated))
    return [(message_id, *fields) for message_id, fields in zip(ids, validated, strict=True)]


def _text(field_name: str, value: object, limit: int) -> str:
    if type(value) is not str and not isinstance(value, str):
        raise InvalidMessageError(field_name, value, f"must be str, not {type(value).__name__}")
    if "\x00" in value:
        raise InvalidMessageError(field_name, _preview(value), "must not contain NUL characters")
    size = _utf8_size(field_name, value)
    if size > limit:
        raise InvalidMessageError(
            field_name, _preview(value), f"is {size:,} bytes; the limit is {limit:,}"
        )
    return value


def _utf8_size(field_name: str, value: str) -> int:
    """The UTF-8 size of ``value``; an error for text that has no UTF-8 form (lone surrogates,
    which PostgreSQL and the brokers cannot store)."""
    if value.isascii():
        return len(value)
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidMessageError(
            field_name,
            _preview(value),
            f"is not valid Unicode text: character {exc.start} is a lone surrogate "
            f"({value[exc.start]!r}), usually bytes decoded with errors='surrogateescape'; "
            "decode the bytes with their real encoding",
        ) from None


def _headers(headers: Mapping[str, str] | None) -> EncodedJson:
    if headers is None or (isinstance(headers, Mapping) and not headers):
        return _NO_HEADERS
    if not isinstance(headers, Mapping):
        raise InvalidMessageError(
            "headers",
            _preview(headers),
            f"must be a mapping of str to str, not {type(headers).__name__}",
        )
    checked: dict[str, str] = {}
    size = 0
    for name, value in headers.items():
        if not isinstance(name, str) or not name:
            raise InvalidMessageError("headers", name, "header names must be non-empty str")
        if name == SEQUENCE_HEADER:
            raise InvalidMessageError(
                f"headers[{name!r}]",
                value,
                "is reserved: relayer stamps it when the store sets sequence_numbers = true",
            )
        if name in _STAMPED_HEADERS:
            raise InvalidMessageError(
                f"headers[{name!r}]",
                _preview(value),
                f"is reserved: relayer sets it on every message ({_STAMPED_HEADERS[name]}); "
                "remove it or use another name",
            )
        if not isinstance(value, str):
            raise InvalidMessageError(
                f"headers[{name!r}]", _preview(value), f"must be str, not {type(value).__name__}"
            )
        for part in (name, value):
            if "\x00" in part:
                raise InvalidMessageError(f"headers[{name!r}]", part, "must not contain NUL")
        size += _utf8_size(f"headers[{name!r}]", name) + _utf8_size(f"headers[{name!r}]", value)
        checked[name] = value
    if size > MAX_HEADERS_BYTES:
        raise InvalidMessageError(
            "headers",
            Shown(f"<{size:,} bytes>"),
            f"the total is limited to {MAX_HEADERS_BYTES:,} bytes; put large data in the body",
        )
    return EncodedJson(json.dumps(checked, ensure_ascii=False, separators=(",", ":")).encode())


def _preview(value: object) -> object:
    text = repr(value)
    return value if len(text) <= 80 else Shown(text[:77] + "...")
