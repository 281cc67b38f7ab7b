"""Messages to rows: what an outbox message must be before anything is written.

Every field of an :class:`OutboxMessage` is checked here (types, sizes, NUL characters, text
that has no UTF-8 form, reserved headers, the store's transports and body limit), and the
message becomes the fields of its row, headers encoded once as JSON (:class:`EncodedJson`).
Nothing here touches a connection or the driver: the gateway (relayer.store.outbox) inserts
what this module returns, and teaches psycopg to send EncodedJson.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from relayer.errors import InvalidMessageError, Shown
from relayer.lanes import UNORDERED_LANE, key_hash, lane_for
from relayer.observability.tracing import with_trace_context
from relayer.settings import StoreSettings
from relayer.store.outbox import EncodedJson, Fields
from relayer.transports.base import MESSAGE_ID_HEADER, ORDERING_KEY_HEADER, SEQUENCE_HEADER
from relayer.writer.sequences import stamped_json

MAX_KEY_BYTES = 1024
MAX_DESTINATION_BYTES = 1024
MAX_HEADERS_BYTES = 64 * 1024
MAX_TRANSPORT_NAME = 128
_STAMPED_HEADERS = {
    MESSAGE_ID_HEADER: "the outbox id",
    ORDERING_KEY_HEADER: "the ordering key",
}


_NO_HEADERS = EncodedJson(b"{}")


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """One message for ``write_many``: the same fields ``write`` takes as arguments."""

    destination: str
    body: bytes
    key: str | None = None
    headers: Mapping[str, str] | None = field(default=None)
    transport: str | None = None
    deliver_at: datetime | None = None


def validate_fields(
    store: StoreSettings,
    *,
    destination: str,
    body: bytes,
    key: str | None,
    headers: Mapping[str, str] | None,
    transport: str | None,
    deliver_at: datetime | None,
) -> Fields:
    """``validate`` for one message given as ``write``'s arguments. The usual message (ASCII
    text within its limits, bytes within the store's limit, no headers, the default transport,
    no delay, no active trace) is accepted here in a few comparisons; any other goes through
    every check of ``validate``, which alone refuses a message."""
    if (
        headers is None
        and transport is None
        and deliver_at is None
        and type(destination) is str
        and type(body) is bytes
        and destination.isascii()
        and 0 < len(destination) <= MAX_DESTINATION_BYTES
        and "\x00" not in destination
        and len(body) <= store.max_body_bytes
        and (store.default_transport is not None or not store.transports)
        and "opentelemetry.trace" not in sys.modules
    ):
        if key is None and store.storage == "delete":
            return (
                UNORDERED_LANE,
                None,
                store.default_transport,
                destination,
                body,
                _NO_HEADERS,
                None,
            )
        if (
            type(key) is str
            and key.isascii()
            and 0 < len(key) <= MAX_KEY_BYTES
            and "\x00" not in key
        ):
            lane = key_hash(key) % store.lanes
            return (lane, key, store.default_transport, destination, body, _NO_HEADERS, None)
    return validate(store, OutboxMessage(destination, body, key, headers, transport, deliver_at))


def validate(store: StoreSettings, message: OutboxMessage) -> Fields:
    """Check one message against the store's rules: the fields of its row, or an
    InvalidMessageError naming the field, the value and the rule (nothing is written)."""
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
    if len(body) > store.max_body_bytes:
        raise InvalidMessageError(
            "body",
            Shown(f"<{len(body):,} bytes>"),
            f"is larger than this store's max_body_bytes ({store.max_body_bytes:,}); "
            "send less, or raise max_body_bytes (the broker must accept it too)",
        )
    key = message.key
    lane = UNORDERED_LANE
    if key is None and store.storage == "partitioned":
        raise InvalidMessageError(
            "key",
            key,
            f"must be set: store {store.name!r} has storage = 'partitioned', which does not take "
            "unordered messages yet (docs/storage.md); give the message a key",
        )
    if key is not None:
        key = _text("key", key, MAX_KEY_BYTES)
        if not key:
            raise InvalidMessageError(
                "key", key, "must not be empty; use key=None for an unordered message"
            )
        lane = lane_for(key, store.lanes)
    transport = _transport(store, message.transport)
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


def _transport(store: StoreSettings, name: str | None) -> str | None:
    if name is None:
        if store.default_transport is None and store.transports:
            known = ", ".join(repr(known) for known in store.transports)
            raise InvalidMessageError(
                "transport",
                None,
                f"store {store.name!r} has no default_transport, so a message must "
                f"name one of its transports ({known}); pass transport=..., or set "
                f"stores.{store.name}.default_transport",
            )
        return store.default_transport
    name = _text("transport", name, MAX_TRANSPORT_NAME)
    if not name:
        raise InvalidMessageError("transport", name, "must not be empty; use None for the default")
    if store.transports and name not in store.transports:
        known = ", ".join(repr(known) for known in store.transports)
        raise InvalidMessageError(
            "transport",
            name,
            f"is not a transport of store {store.name!r} (configured: {known}); name "
            "one of them, or configure it in the store's settings",
        )
    return name


def validate_all(store: StoreSettings, messages: Iterable[OutboxMessage]) -> list[Fields]:
    """Check every message, naming a refused one by its position (``messages[3].key``)."""
    validated: list[Fields] = []
    for index, message in enumerate(messages):
        if not isinstance(message, OutboxMessage):
            raise InvalidMessageError(
                f"messages[{index}]", type(message).__name__, "must be a relayer.OutboxMessage"
            )
        try:
            validated.append(validate(store, message))
        except InvalidMessageError as exc:
            raise InvalidMessageError(
                f"messages[{index}].{exc.field}", exc.value, exc.rule
            ) from None
    return validated


def stamp_sequence_numbers(validated: list[Fields], first: Mapping[str, int]) -> list[Fields]:
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
