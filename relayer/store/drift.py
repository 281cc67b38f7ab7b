"""The drift check: every difference between a store's tables and this version's migrations,
and the check a worker runs before serving a store (:func:`require_meta`), which includes it.

The expected tables are built as temporary tables inside a transaction that is rolled back,
and the catalogs of both are compared, so the expectation is always exactly what the
migrations create. Both catalogs are read under the pinned search_path (relayer/sql/schema.sql).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from relayer.errors import MissingPrivilegeError, SchemaDriftError
from relayer.identifiers import TABLE_SUFFIXES, StoreNames
from relayer.settings import StoreSettings
from relayer.sql import Queries, compose, latest_version, migrations, queries_for
from relayer.store.driver import Connection
from relayer.store.partitions import check_storage, storage_of
from relayer.store.schema import StoreMeta, read_meta, verify_meta

_TEMP = "pg_temp"
# Expected catalogs kept (one per database, table prefix and schema version served).
EXPECTED_KEPT = 32
_QUALIFIER = re.compile(r' ON (ONLY )?(?:"(?:[^"]|"")+"|[a-z_][a-z0-9_$]*)\.')


@dataclass(frozen=True, slots=True)
class Drift:
    """One difference between the database and what this version of relayer expects."""

    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Catalog:
    """Tables' columns, indexes and constraints, by table name."""

    columns: dict[str, dict[str, tuple[str, bool, str]]]
    indexes: dict[str, dict[str, str]]
    constraints: dict[str, set[str]]


_EXPECTED: dict[tuple[object, ...], Catalog] = {}  # by database, prefix, version, tables


async def check(conn: Connection, store: StoreSettings) -> list[Drift]:
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
    try:
        cursor = await conn.execute(queries["applied_migrations"])
        drift += checksum_drift({int(row[0]): str(row[2]) for row in await cursor.fetchall()})
        drift.extend(await _compare_catalogs(conn, store, meta.schema_version))
    except psycopg.errors.InsufficientPrivilege as exc:
        raise MissingPrivilegeError(
            f"store {store.name!r}: schema check: {exc.diag.message_primary or exc}; run it as "
            "the tables' owner (it reads every table of the store)"
        ) from exc
    return drift


async def require_meta(conn: Connection, store: StoreSettings) -> StoreMeta:
    """The store's metadata, for a worker about to serve it: refuses a missing schema, an old
    schema, a lane-count mismatch, and tables that drifted from this version's migrations
    (what ``relayer schema check`` lists) instead of failing on them batch after batch."""
    meta = verify_meta(store, await read_meta(conn, store.names))
    check_storage(store, await storage_of(conn, store))
    if meta.schema_version == latest_version():  # a newer schema is the newer relayer's to check
        try:
            drift = await check(conn, store)
        except MissingPrivilegeError:
            return meta  # the comparison needs TEMP; `relayer schema check` run by the owner can
        if drift:
            raise drift_error(store, drift)
    return meta


def checksum_drift(recorded: dict[int, str]) -> list[Drift]:
    """The applied migrations (version -> checksum, as recorded) whose text changed since."""
    return [
        Drift(f"migration {migration.label}", "its text changed since it was applied")
        for migration in migrations()
        if recorded.get(migration.version, migration.checksum) != migration.checksum
    ]


def drift_error(store: StoreSettings, drift: Sequence[Drift]) -> SchemaDriftError:
    """Why a worker refuses ``store``, whose tables differ from this version's (``drift``)."""
    shown = "; ".join(str(item) for item in drift[:3])
    more = f"; and {len(drift) - 3} more" if len(drift) > 3 else ""
    return SchemaDriftError(
        f"store {store.name!r}: its tables differ from schema version {latest_version()} "
        f"({shown}{more}); restore them as `relayer schema print {store.name}` shows, "
        f"until `relayer schema check {store.name}` passes"
    )


async def _compare_catalogs(
    conn: Connection, store: StoreSettings, live_version: int
) -> list[Drift]:
    names = store.names
    queries = queries_for(names)
    tables = checked_tables(names)
    # Both catalogs are read under the pinned search_path: pg_get_expr shows a function
    # qualified or not depending on it, and the expected tables must bind what apply binds.
    async with conn.cursor() as cursor, conn.transaction(force_rollback=True):
        await cursor.execute(queries["pin_search_path"])
        await cursor.execute(queries["catalog_schema_oid"], (names.schema,))
        row = await cursor.fetchone()
        if row is None:
            return [Drift(f"schema {names.schema}", "missing")]
        live = await _introspect(cursor, queries, int(row[0]), tables)
        try:
            expected = await _expected(
                conn, cursor, names, tables, live_version, storage=store.storage
            )
        except psycopg.errors.InsufficientPrivilege as exc:
            raise _without_temporary(conn, store) from exc
    return catalog_drift(names, expected, live)


def catalog_drift(names: StoreNames, expected: Catalog, live: Catalog) -> list[Drift]:
    """What differs between the store's tables (``live``) and what the migrations create."""
    drift: list[Drift] = []
    for table in sorted(set(expected.columns) | set(live.columns)):
        subject = f"{names.schema}.{table}"
        if table not in live.columns:
            drift.append(Drift(subject, "table missing"))
        elif table in expected.columns:  # else created by a later migration than this version's
            drift.extend(Drift(subject, detail) for detail in _differences(table, expected, live))
    return drift


def checked_tables(names: StoreNames) -> list[str]:
    """The store's tables the drift check compares (its migrations table aside)."""
    return [names.table(role) for role in TABLE_SUFFIXES if role != "migrations"]


async def expected_catalog(
    conn: Connection, names: StoreNames, tables: Sequence[str], version: int
) -> Catalog:
    """The catalog the migrations up to ``version`` create (built in a transaction rolled
    back, under the pinned search_path, once per database, prefix and version in a process).
    psycopg's InsufficientPrivilege without the TEMPORARY privilege."""
    found = _EXPECTED.get((*_expected_key(conn, names, tables, version), "delete"))
    if found is not None:
        return found
    queries = queries_for(names)
    async with conn.cursor() as cursor, conn.transaction(force_rollback=True):
        await cursor.execute(queries["pin_search_path"])
        return await _expected(conn, cursor, names, tables, version)


def index_definition(definition: str) -> str:
    """An index's definition as compared: without its table's schema, and without ONLY (the
    index of a partitioned outbox, partitioned storage, is the same index)."""
    return _QUALIFIER.sub(" ON ", definition)


def _differences(table: str, expected: Catalog, live: Catalog) -> list[str]:
    """What differs in ``table`` (in both catalogs) from what the migrations create."""
    found: list[str] = []
    for column, shape in expected.columns[table].items():
        actual = live.columns[table].get(column)
        if actual is None:
            found.append(f"column {column} missing")
        elif actual != shape:
            found.append(f"column {column} is {_shape(actual)}, expected {_shape(shape)}")
    for column in live.columns[table].keys() - expected.columns[table].keys():
        found.append(f"column {column} is not part of relayer's schema")
    live_indexes = live.indexes.get(table, {})
    for index, definition in expected.indexes.get(table, {}).items():
        if index not in live_indexes:
            found.append(f"index {index} missing")
        elif live_indexes[index] != definition:
            found.append(f"index {index} is `{live_indexes[index]}`, expected `{definition}`")
    for definition in expected.constraints.get(table, set()) - live.constraints.get(table, set()):
        found.append(f"constraint missing: {definition}")
    return found


async def _introspect(
    cursor: psycopg.AsyncCursor[Any], queries: Queries, namespace: int, tables: Sequence[str]
) -> Catalog:
    columns: dict[str, dict[str, tuple[str, bool, str]]] = {}
    indexes: dict[str, dict[str, str]] = {}
    constraints: dict[str, set[str]] = {}
    await cursor.execute(queries["catalog_columns"], (namespace, list(tables)))
    for table, column, type_name, not_null, default in await cursor.fetchall():
        columns.setdefault(table, {})[column] = (type_name, not_null, default)
    await cursor.execute(queries["catalog_indexes"], (namespace, list(tables)))
    for table, index, definition in await cursor.fetchall():
        indexes.setdefault(table, {})[index] = index_definition(definition)
    await cursor.execute(queries["catalog_constraints"], (namespace, list(tables)))
    for table, definition in await cursor.fetchall():
        constraints.setdefault(table, set()).add(definition)
    return Catalog(columns, indexes, constraints)


async def _expected(
    conn: Connection,
    cursor: psycopg.AsyncCursor[Any],
    names: StoreNames,
    tables: Sequence[str],
    version: int,
    *,
    storage: str = "delete",
) -> Catalog:
    """The catalog the migrations up to ``version`` create (and, for ``storage`` =
    "partitioned", what apply makes of a new store of that mode), as read on ``conn``'s
    database: built once per database, table prefix, version and mode in a process (it does
    not depend on the store's schema), so that a worker checking hundreds of stores before
    serving them does not run every migration again for each (four fifths of a check's time)."""
    key = (*_expected_key(conn, names, tables, version), storage)
    found = _EXPECTED.get(key)
    if found is None:
        found = await _expected_catalog(conn, cursor, names, tables, version, storage=storage)
        if len(_EXPECTED) >= EXPECTED_KEPT:
            del _EXPECTED[next(iter(_EXPECTED))]  # the oldest entry
        _EXPECTED[key] = found
    return found


def _expected_key(
    conn: Connection, names: StoreNames, tables: Sequence[str], version: int
) -> tuple[object, ...]:
    info = conn.info
    return (info.host, info.port, info.dbname, info.server_version, names.prefix, version, *tables)


async def _expected_catalog(
    conn: Connection,
    cursor: psycopg.AsyncCursor[Any],
    names: StoreNames,
    tables: Sequence[str],
    version: int,
    *,
    storage: str,
) -> Catalog:
    temp = StoreNames(_TEMP, names.prefix)
    queries = queries_for(names)
    async with conn.transaction(force_rollback=True):
        for migration in migrations():
            if migration.version <= version:
                await cursor.execute(compose(migration.template, temp))
        if storage == "partitioned":
            await cursor.execute(queries_for(temp)["partitioned_create_tables"])
        await cursor.execute(queries["catalog_temp_schema_oid"])
        row = await cursor.fetchone()
        assert row is not None
        return await _introspect(cursor, queries, int(row[0]), tables)


def _without_temporary(conn: Connection, store: StoreSettings) -> MissingPrivilegeError:
    database, role = conn.info.dbname, conn.info.user
    grant = sql.SQL("GRANT TEMPORARY ON DATABASE {} TO {}").format(
        sql.Identifier(database), sql.Identifier(role)
    )
    return MissingPrivilegeError(
        f"store {store.name!r}: schema check needs the TEMPORARY privilege on database "
        f"{database!r}, which role {role!r} lacks (it builds this version's tables as temporary "
        f"tables to compare them with the store's); run it as the tables' owner, or "
        f"{grant.as_string(None)}"
    )


def _shape(shape: tuple[str, bool, str]) -> str:
    type_name, not_null, default = shape
    text = type_name + (" NOT NULL" if not_null else " NULL")
    return text + (f" DEFAULT {default}" if default else "")
