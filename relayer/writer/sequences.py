"""Per-key sequence numbers, stamped by the writer when a store sets ``sequence_numbers``.

Each ordering key has a counter row. A write upserts it (``reserve_sequences``) in the caller's
transaction, which locks the row until that transaction ends: a second writer of the same key
waits for the first one's commit or rollback. So numbers are gapless (a rollback gives its
numbers back) and follow commit order per key, at the price of serializing writers of one key
and one more round trip per write. The number travels as the ``relayer-sequence`` header; the
consumer's inbox compares it with the last one it saw (``relayer.inbox``).

The outbox id is taken after the counter's lock, so id order (the relay's sending order) agrees
with sequence order, except for writers on different hosts whose clocks disagree or that commit
within the same millisecond; the inbox then reports the inversion instead of hiding it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, LiteralString

import psycopg

from relayer.transports.base import SEQUENCE_HEADER


def _counts(keys: Iterable[str | None]) -> dict[str, list[Any]]:
    counts = Counter(key for key in keys if key is not None)
    ordered = sorted(counts)
    return {"keys": ordered, "counts": [counts[key] for key in ordered]}


def _first_numbers(
    returned: Iterable[tuple[Any, ...]], counts: Mapping[str, list[Any]]
) -> dict[str, int]:
    """key -> the first number reserved for it (the counter returns the last)."""
    reserved = dict(zip(counts["keys"], counts["counts"], strict=True))
    return {str(key): int(last) - reserved[key] + 1 for key, last in returned}


def reserve_sync(
    connection: psycopg.Connection[Any],
    query: LiteralString,
    keys: Iterable[str | None],
    prepare: bool | None = None,
) -> dict[str, int]:
    """Reserve numbers for ``keys`` (one per occurrence; None is skipped): key -> first.
    ``prepare`` is psycopg's (relayer.pooler.caller_prepare)."""
    counts = _counts(keys)
    if not counts["keys"]:
        return {}
    rows = connection.execute(query, counts, prepare=prepare).fetchall()
    return _first_numbers(rows, counts)


async def reserve_async(
    connection: psycopg.AsyncConnection[Any],
    query: LiteralString,
    keys: Iterable[str | None],
    prepare: bool | None = None,
) -> dict[str, int]:
    counts = _counts(keys)
    if not counts["keys"]:
        return {}
    cursor = await connection.execute(query, counts, prepare=prepare)
    return _first_numbers(await cursor.fetchall(), counts)


def stamped_json(headers: bytes, sequence: int) -> bytes:
    """``headers`` (a JSON object the writer encoded) with the sequence header added."""
    entry = f'"{SEQUENCE_HEADER}":"{sequence}"'.encode()
    if headers.strip() == b"{}":
        return b"{" + entry + b"}"
    # The writer's own compact encoding always ends with the object's closing brace.
    return headers[:-1] + b"," + entry + b"}"


def sequence_of(value: object) -> int | None:
    """The sequence number in a header value (str or bytes), or None when it is not one."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("ascii", "replace")
    if isinstance(value, str) and value.isascii() and value.isdigit() and 0 < len(value) <= 19:
        number = int(value)
        return number if number >= 1 else None
    return None
