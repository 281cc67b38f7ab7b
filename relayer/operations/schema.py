"""A store's schema: numbered migrations, idempotent concurrent-safe apply, and drift checks.

``apply`` takes a transaction-scoped advisory lock keyed by the store's schema and prefix, so
two processes applying at once serialize; the second finds nothing left to do. ``check``
builds the expected tables as temporary tables inside a transaction it rolls back, and compares
the catalog of both, so the expectation is always exactly what the migrations create.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from relayer.errors import (
    LaneCountMismatchError,
    SchemaDriftError,
    SchemaNotAppliedError,
    StoreError,
)
from relayer.identifiers import TABLE_SUFFIXES, StoreNames
from relayer.settings import StoreSettings
from relayer.sql import compose, queries_for

# Inside apply's transaction (and the drift check's), names in the migrations resolve to
# PostgreSQL's own functions, types and operators whatever the role's or database's search_path
# puts first: a column default is bound when it is created, so a schema placed ahead of
# pg_catalog (`search_path = evil, pg_catalog`) could otherwise plant its now() in every insert.
# SET LOCAL ends with the transaction, so a pooled connection keeps its own setting.
PIN_SEARCH_PATH: LiteralString = "SET LOCAL search_path = pg_catalog, pg_temp"
_MIGRATION_FILE = re.compile(r"(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql")
_TEMP = "pg_temp"


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    template: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.template.encode("utf-8")).hexdigest()[:16]

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@cache
def migrations() -> tuple[Migration, ...]:
    """Every migration shipped with this version, in version order."""
    found: list[Migration] = []
    for entry in resources.files("relayer.migrations").iterdir():
        match = _MIGRATION_FILE.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match["version"]), match["name"], entry.read_text("utf-8")))
    found.sort(key=lambda migration: migration.version)
    versions = [migration.version for migration in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"relayer migrations are not numbered 1..n without gaps: {versions}")
    return tuple(found)


def latest_version() -> int:
    return migrations()[-1].version


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


@dataclass(frozen=True, slots=True)
class Drift:
    """One difference between the database and what this version of relayer expects."""

    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.detail}"


def render(store: StoreSettings) -> str:
    """The whole DDL script ``apply`` would run on an empty database, for a DBA to review."""
    names = store.names
    queries = queries_for(names)
    parts = [
        "BEGIN;",
        PIN_SEARCH_PATH + ";",
        f"SELECT pg_catalog.pg_advisory_xact_lock({names.lock_key});",
        queries["create_schema"] + ";",
        queries["create_migrations_table"] + ";",
    ]
    for migration in migrations():
        parts.append(f"-- migration {migration.label}")
        parts.append(compose(migration.template, names).as_string(None).strip())
        parts.append(
            sql.SQL("INSERT INTO {} (version, name, checksum) VALUES ({}, {}, {});")
            .format(
                sql.Identifier(names.schema, names.table("migrations")),
                migration.version,
                migration.name,
                migration.checksum,
            )
            .as_string(None)
        )
    parts.append(
        sql.SQL("INSERT INTO {} (lanes, schema_version) VALUES ({}, {});")
        .format(sql.Identifier(names.schema, names.table("meta")), store.lanes, latest_version())
        .as_string(None)
    )
    # The only parameter is the validated integer lane count, rendered as a literal for review.
    parts.append(queries["ensure_lane_rows"].replace("%(lanes)s", str(int(store.lanes))) + ";")
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"


async def read_meta(conn: psycopg.AsyncConnection[Any], names: StoreNames) -> StoreMeta | None:
    """The store's recorded lane count and schema version, or None if it was never applied."""
    queries = queries_for(names)
    cursor = await conn.execute(
        queries["table_exists"], (f'"{names.schema}"."{names.table("meta")}"',)
    )
    row = await cursor.fetchone()
    if not row or not row[0]:
        return None
    cursor = await conn.execute(queries["read_meta"])
    meta = await cursor.fetchone()
    if meta is None:
        return None
    return StoreMeta(lanes=int(meta[0]), schema_version=int(meta[1]))


async def require_meta(conn: psycopg.AsyncConnection[Any], store: StoreSettings) -> StoreMeta:
    """The store's metadata, for a worker about to serve it: refuses a missing schema, an old
    schema, a lane-count mismatch, and tables that drifted from this version's migrations
    (what ``relayer schema check`` lists) instead of failing on them batch after batch."""
    meta = verify_meta(store, await read_meta(conn, store.names))
    if meta.schema_version == latest_version():  # a newer schema is the newer relayer's to check
        try:
            drift = await check(conn, store)
        except psycopg.errors.InsufficientPrivilege:
            return meta  # the comparison needs TEMP; `relayer schema check` run by the owner can
        if drift:
            shown = "; ".join(str(item) for item in drift[:3])
            more = f"; and {len(drift) - 3} more" if len(drift) > 3 else ""
            raise SchemaDriftError(
                f"store {store.name!r}: its tables differ from schema version {latest_version()} "
                f"({shown}{more}); restore them as `relayer schema print {store.name}` shows, "
                f"until `relayer schema check {store.name}` passes"
            )
    return meta


async def require_schema(conn: psycopg.AsyncConnection[Any], store: StoreSettings) -> StoreMeta:
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


async def apply(conn: psycopg.AsyncConnection[Any], store: StoreSettings) -> ApplyResult:
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
            await conn.execute(PIN_SEARCH_PATH)
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
    except psycopg.Error as exc:
        raise StoreError(f"store {store.name!r}: schema apply failed: {exc}") from exc
    return ApplyResult(tuple(applied), latest_version(), store.lanes, lanes_changed_from)


async def _change_lane_count(
    conn: psycopg.AsyncConnection[Any], store: StoreSettings, recorded: int
) -> None:
    queries = queries_for(store.names)
    # SHARE mode waits for in-flight writers and blocks new ones until this transaction ends,
    # so no row can slip in between the emptiness check and the new lane count.
    await conn.execute(
        sql.SQL("LOCK TABLE {} IN SHARE MODE").format(
            sql.Identifier(store.db_schema, store.names.table("outbox"))
        )
    )
    cursor = await conn.execute(queries["any_pending_row"])
    row = await cursor.fetchone()
    if row and row[0]:
        raise LaneCountMismatchError(store.name, store.lanes, recorded)
    await conn.execute(queries["update_meta_lanes"], (store.lanes,))


# -- drift -------------------------------------------------------------------------------------

_COLUMNS: LiteralString = """
SELECT c.relname, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
       coalesce(pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE c.relnamespace = %s AND c.relname = ANY(%s) AND c.relkind IN ('r', 'p')
"""
_INDEXES: LiteralString = """
SELECT t.relname, i.relname, pg_catalog.pg_get_indexdef(i.oid)
FROM pg_catalog.pg_index x
JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
JOIN pg_catalog.pg_class t ON t.oid = x.indrelid
WHERE t.relnamespace = %s AND t.relname = ANY(%s)
"""
_CONSTRAINTS: LiteralString = """
SELECT t.relname, pg_catalog.pg_get_constraintdef(k.oid)
FROM pg_catalog.pg_constraint k JOIN pg_catalog.pg_class t ON t.oid = k.conrelid
WHERE t.relnamespace = %s AND t.relname = ANY(%s) AND k.contype IN ('c', 'u', 'f')
"""
_SCHEMA_OID: LiteralString = "SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = %s"
_TEMP_OID: LiteralString = "SELECT pg_catalog.pg_my_temp_schema()::oid"
_QUALIFIER = re.compile(r' ON (ONLY )?(?:"(?:[^"]|"")+"|[a-z_][a-z0-9_$]*)\.')


@dataclass(frozen=True, slots=True)
class _Catalog:
    columns: dict[str, dict[str, tuple[str, bool, str]]]
    indexes: dict[str, dict[str, str]]
    constraints: dict[str, set[str]]


async def _introspect(
    cursor: psycopg.AsyncCursor[Any], namespace: int, tables: Sequence[str]
) -> _Catalog:
    columns: dict[str, dict[str, tuple[str, bool, str]]] = {}
    indexes: dict[str, dict[str, str]] = {}
    constraints: dict[str, set[str]] = {}
    await cursor.execute(_COLUMNS, (namespace, list(tables)))
    for table, column, type_name, not_null, default in await cursor.fetchall():
        columns.setdefault(table, {})[column] = (type_name, not_null, default)
    await cursor.execute(_INDEXES, (namespace, list(tables)))
    for table, index, definition in await cursor.fetchall():
        indexes.setdefault(table, {})[index] = _QUALIFIER.sub(r" ON \1", definition)
    await cursor.execute(_CONSTRAINTS, (namespace, list(tables)))
    for table, definition in await cursor.fetchall():
        constraints.setdefault(table, set()).add(definition)
    return _Catalog(columns, indexes, constraints)


async def check(conn: psycopg.AsyncConnection[Any], store: StoreSettings) -> list[Drift]:
    """Every difference between the store's tables and this version's migrations."""
    names = store.names
    queries = queries_for(names)
    meta = await read_meta(conn, names)
    if meta is None:
        return [Drift(f"{names.schema}.{names.table('meta')}", "missing: schema never applied")]
    drift: list[Drift] = []
    if meta.schema_version < latest_version():
        pending = [m.label for m in migrations() if m.version > meta.schema_version]
        drift.append(
            Drift("schema_version", f"{meta.schema_version}; pending: {', '.join(pending)}")
        )
    elif meta.schema_version > latest_version():
        drift.append(
            Drift(
                "schema_version",
                f"{meta.schema_version} was written by a newer relayer (this one knows "
                f"{latest_version()}); upgrade relayer",
            )
        )
    if meta.lanes != store.lanes:
        drift.append(Drift("lanes", f"recorded {meta.lanes}, configured {store.lanes}"))
    cursor = await conn.execute(queries["applied_migrations"])
    recorded = {int(row[0]): str(row[2]) for row in await cursor.fetchall()}
    for migration in migrations():
        checksum = recorded.get(migration.version)
        if checksum is not None and checksum != migration.checksum:
            drift.append(
                Drift(f"migration {migration.label}", "its text changed since it was applied")
            )
    drift.extend(await _compare_catalogs(conn, store, meta.schema_version))
    return drift


async def _compare_catalogs(
    conn: psycopg.AsyncConnection[Any], store: StoreSettings, live_version: int
) -> list[Drift]:
    names = store.names
    tables = [names.table(role) for role in TABLE_SUFFIXES if role != "migrations"]
    drift: list[Drift] = []
    # Both catalogs are read under the pinned search_path: pg_get_expr shows a function
    # qualified or not depending on it, and the expected tables must bind what apply binds.
    async with conn.cursor() as cursor, conn.transaction(force_rollback=True):
        await cursor.execute(PIN_SEARCH_PATH)
        await cursor.execute(_SCHEMA_OID, (names.schema,))
        row = await cursor.fetchone()
        if row is None:
            return [Drift(f"schema {names.schema}", "missing")]
        live = await _introspect(cursor, int(row[0]), tables)
        expected = await _expected_catalog(conn, cursor, names, tables, live_version)
    for table in sorted(set(expected.columns) | set(live.columns)):
        subject = f"{names.schema}.{table}"
        if table not in live.columns:
            drift.append(Drift(subject, "table missing"))
            continue
        if table not in expected.columns:
            continue  # created by a later migration than this version knows
        for column, shape in expected.columns[table].items():
            actual = live.columns[table].get(column)
            if actual is None:
                drift.append(Drift(subject, f"column {column} missing"))
            elif actual != shape:
                drift.append(
                    Drift(subject, f"column {column} is {_shape(actual)}, expected {_shape(shape)}")
                )
        for column in live.columns[table].keys() - expected.columns[table].keys():
            drift.append(Drift(subject, f"column {column} is not part of relayer's schema"))
        live_indexes = live.indexes.get(table, {})
        for index, definition in expected.indexes.get(table, {}).items():
            if index not in live_indexes:
                drift.append(Drift(subject, f"index {index} missing"))
            elif live_indexes[index] != definition:
                drift.append(
                    Drift(
                        subject,
                        f"index {index} is `{live_indexes[index]}`, expected `{definition}`",
                    )
                )
        for definition in expected.constraints.get(table, set()) - live.constraints.get(
            table, set()
        ):
            drift.append(Drift(subject, f"constraint missing: {definition}"))
    return drift


async def _expected_catalog(
    conn: psycopg.AsyncConnection[Any],
    cursor: psycopg.AsyncCursor[Any],
    names: StoreNames,
    tables: Sequence[str],
    version: int,
) -> _Catalog:
    temp = StoreNames(_TEMP, names.prefix)
    async with conn.transaction(force_rollback=True):
        for migration in migrations():
            if migration.version <= version:
                await cursor.execute(compose(migration.template, temp))
        await cursor.execute(_TEMP_OID)
        row = await cursor.fetchone()
        assert row is not None
        return await _introspect(cursor, int(row[0]), tables)


def _shape(shape: tuple[str, bool, str]) -> str:
    type_name, not_null, default = shape
    text = type_name + (" NOT NULL" if not_null else " NULL")
    return text + (f" DEFAULT {default}" if default else "")
