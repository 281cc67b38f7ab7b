"""The dispatch layer's database helpers: queue lock keys and the schema version it needs.

Its SQL lives in ``relayer/sql/dispatch.sql`` (named queries starting with ``queue_``), loaded
and composed for each store by :func:`relayer.sql.queries_for` like every other query.
"""

from __future__ import annotations

from typing import Any

import psycopg

from relayer.errors import SchemaNotAppliedError
from relayer.identifiers import StoreNames
from relayer.lanes import fnv1a_32
from relayer.schema import read_meta
from relayer.settings import StoreSettings

DISPATCH_SCHEMA_VERSION = 2  # the migration that created the queue tables (0002_dispatch)


def queue_lock_key(names: StoreNames, queue: str) -> int:
    """The first key of a queue's slot locks: stable, positive, distinct per store and queue.

    Advisory locks are per database, so only queues of stores in one database share the key
    space; a collision between two of them (odds ~1 in 2**31 per pair) would make them share
    slots, which lowers concurrency but never lets a queue exceed its limit.
    """
    text = f"{names.schema}.{names.prefix}queues/{queue}"
    return fnv1a_32(text.encode("utf-8")) & 0x7FFF_FFFF


async def require_dispatch_schema(conn: psycopg.AsyncConnection[Any], store: StoreSettings) -> None:
    """Refuse a store whose schema predates the queue tables (or was never applied)."""
    meta = await read_meta(conn, store.names)
    if meta is None or meta.schema_version < DISPATCH_SCHEMA_VERSION:
        found = "no relayer tables" if meta is None else f"schema version {meta.schema_version}"
        raise SchemaNotAppliedError(
            f"store {store.name!r}: {found} in schema {store.db_schema!r} with prefix "
            f"{store.table_prefix!r}; the queue tables need version {DISPATCH_SCHEMA_VERSION}: "
            f"run `relayer schema apply {store.name}`"
        )
