"""The statements of a store's schema: its recorded metadata, the check an operator command
runs before touching the tables, and the idempotent, concurrency-safe apply.

``apply`` takes a transaction-scoped advisory lock keyed by the store's schema and prefix, so
two processes applying at once serialize; the second finds nothing left to do. The migrations
are relayer.sql's (:func:`~relayer.sql.migrations`); the drift check, and the worker's
check that includes it, are :mod:`relayer.store.drift`'s. ``relayer schema`` reaches all of
it through ``relayer.operations.schema``.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from relayer.errors import LaneCountMismatchError, SchemaNotAppliedError, StoreError
from relayer.identifiers import StoreNames
from relayer.settings import StoreSettings
from relayer.sql import compose, latest_version, migrations, queries_for
from relayer.store import partitions
from relayer.store.driver import Connection


@dataclass(frozen=True, slots=True)
class StoreMeta:
    lanes: int
    schema_version: int


@dataclass(frozen=True, slots=True)
class ApplyResult:
    applied: tuple[str, ...]
    schema_version: int
    lanes: int
    lanes_changed_from: int | None = None


def meta_table(names: StoreNames) -> str:
    """The store's metadata table as to_regclass reads it: quoted and qualified."""
    return f'"{names.schema}"."{names.table("meta")}"'


async def read_meta(conn: Connection, names: StoreNames) -> StoreMeta | None:
    """The store's recorded lane count and schema version, or None if it was never applied."""
    queries = queries_for(names)
    cursor = await conn.execute(queries["table_exists"], (meta_table(names),))
    row = await cursor.fetchone()
    if not row or not row[0]:
        return None
    cursor = await conn.execute(queries["read_meta"])
    meta = await cursor.fetchone()
    if meta is None:
        return None
    return StoreMeta(lanes=int(meta[0]), schema_version=int(meta[1]))


async def require_schema(conn: Connection, store: StoreSettings) -> StoreMeta:
    """The store's metadata, for an operator command about to read or change its tables:
    refuses a schema never applied or too old, and a lane-count mismatch, saying what to run
    (instead of failing on a missing table)."""
    return verify_meta(store, await read_meta(conn, store.names))


def verify_meta(store: StoreSettings, meta: StoreMeta | None) -> StoreMeta:
    """Refuse a store whose schema is missing or too old, or whose lane count differs."""
    if meta is None:
        raise SchemaNotAppliedError(
            f"store {store.name!r}: no relayer tables in schema {store.db_schema!r} with prefix "
            f"{store.table_prefix!r}; run `relayer schema apply {store.name}` first"
        )
    if meta.schema_version < latest_version():
        raise SchemaNotAppliedError(
            f"store {store.name!r}: schema version {meta.schema_version} is older than this "
            f"relayer's {latest_version()}; run `relayer schema apply {store.name}`"
        )
    if meta.lanes != store.lanes:
        raise LaneCountMismatchError(store.name, store.lanes, meta.lanes)
    return meta


async def apply(conn: Connection, store: StoreSettings) -> ApplyResult:
    """Bring the store's schema up to date in one transaction. Idempotent and concurrency-safe.

    Records the lane count on first apply. A different configured lane count is accepted only
    while the outbox is empty (it is then recorded); otherwise LaneCountMismatchError.
    """
    names = store.names
    queries = queries_for(names)
    applied: list[str] = []
    lanes_changed_from: int | None = None
    try:
        async with conn.transaction():
            await conn.execute(queries["pin_search_path"])
            await conn.execute(queries["lock_schema_changes"], (names.lock_key,))
            await conn.execute(queries["create_schema"])
            await conn.execute(queries["create_migrations_table"])
            cursor = await conn.execute(queries["applied_migrations"])
            done = {int(row[0]): str(row[2]) for row in await cursor.fetchall()}
            for migration in migrations():
                if migration.version in done:
                    continue
                await conn.execute(compose(migration.template, names))
                await conn.execute(
                    queries["record_migration"],
                    (migration.version, migration.name, migration.checksum),
                )
                applied.append(migration.label)
            meta = await read_meta(conn, names)
            await _storage(conn, store, new=meta is None)
            if meta is None:
                await conn.execute(queries["insert_meta"], (store.lanes, latest_version()))
            else:
                if meta.schema_version != latest_version():
                    await conn.execute(queries["update_meta_version"], (latest_version(),))
                if meta.lanes != store.lanes:
                    await _change_lane_count(conn, store, meta.lanes)
                    lanes_changed_from = meta.lanes
            await conn.execute(queries["trim_lane_rows"], {"lanes": store.lanes})
            await conn.execute(queries["ensure_lane_rows"], {"lanes": store.lanes})
            if store.storage == "partitioned":
                await conn.execute(
                    queries["partitioned_ensure_progress_rows"], {"lanes": store.lanes}
                )
    except psycopg.Error as exc:
        raise StoreError(f"store {store.name!r}: schema apply failed: {exc}") from exc
    return ApplyResult(tuple(applied), latest_version(), store.lanes, lanes_changed_from)


async def _storage(conn: Connection, store: StoreSettings, *, new: bool) -> None:
    """A store created by this apply with storage = "partitioned" is made partitioned; an
    existing store configured for the other mode than its outbox has is refused (exit 2)."""
    if new and store.storage == "partitioned":
        if await partitions.storage_of(conn, store) != "partitioned":
            await partitions.create_tables(conn, store)
        return
    partitions.check_storage(store, await partitions.storage_of(conn, store))


async def _change_lane_count(conn: Connection, store: StoreSettings, recorded: int) -> None:
    queries = queries_for(store.names)
    await conn.execute(queries["lock_outbox_for_lane_change"])
    cursor = await conn.execute(queries["any_pending_row"])
    row = await cursor.fetchone()
    if row and row[0]:
        raise LaneCountMismatchError(store.name, store.lanes, recorded)
    await conn.execute(queries["update_meta_lanes"], (store.lanes,))


async def drop(conn: Connection, store: StoreSettings) -> None:
    """Drop the store's whole schema, tables and all (a test's or the demo's own schema)."""
    await conn.execute(queries_for(store.names)["drop_schema"])
