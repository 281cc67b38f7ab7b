"""``relayer schema print|apply|check``: a store's schema as an operator sees it.

:func:`render` prints the DDL script ``apply`` would run on an empty database, for a DBA to
review. Everything that reads or changes the database is the gateway's
(:mod:`relayer.store.schema`: metadata, ``apply``; :mod:`relayer.store.drift`: ``check`` and
the worker's ``require_meta``) and is named here too, with the migrations
(:func:`relayer.sql.migrations`), for the commands and tools that use them.
"""

from __future__ import annotations

from psycopg import sql

from relayer.errors import ConfigurationError
from relayer.settings import StoreSettings
from relayer.sql import Migration, compose, latest_version, migrations, queries_for
from relayer.store.drift import Drift, check, require_meta
from relayer.store.schema import (
    ApplyResult,
    StoreMeta,
    apply,
    read_meta,
    require_schema,
    verify_meta,
)

__all__ = [
    "ApplyResult",
    "Drift",
    "Migration",
    "StoreMeta",
    "apply",
    "check",
    "latest_version",
    "migrations",
    "read_meta",
    "render",
    "require_meta",
    "require_schema",
    "verify_meta",
]


def render(
    store: StoreSettings, start: int = 0, end: int | None = None, *, transaction: bool = True
) -> str:
    """The DDL that takes the store's tables from schema version ``start`` (0: no relayer
    tables) to ``end`` (default: this relayer's), as ``apply`` would run it: the migrations in
    between (``schema/NNNN_name.sql``, composed with the store's identifiers), their records in
    the migrations table and the metadata row. For a DBA to review, or for a migration tool
    (Flyway, Liquibase, Alembic, Django) to run; ``transaction=False`` leaves out BEGIN and
    COMMIT for tools that wrap each migration in a transaction of their own."""
    if store.storage == "partitioned":
        # Its first partitions follow the database clock when it is created (docs/storage.md).
        raise ConfigurationError(
            f"stores.{store.name}.storage",
            store.storage,
            "has no printed DDL yet: `relayer schema print` and `relayer schema sql` print "
            "delete mode's; create a partitioned store with `relayer schema apply` "
            "(docs/storage.md)",
        )
    last = latest_version()
    end = last if end is None else end
    if not 0 <= start < end <= last:
        raise ValueError(f"versions must satisfy 0 <= start < end <= {last}: {start}, {end}")
    names = store.names
    queries = queries_for(names)
    meta = sql.Identifier(names.schema, names.table("meta"))
    parts = [
        queries["pin_search_path"] + ";",
        f"SELECT pg_catalog.pg_advisory_xact_lock({names.lock_key});",
    ]
    if start == 0:
        parts += [queries["create_schema"] + ";", queries["create_migrations_table"] + ";"]
    for migration in migrations()[start:end]:
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
    if start == 0:
        parts.append(
            sql.SQL("INSERT INTO {} (lanes, schema_version) VALUES ({}, {});")
            .format(meta, store.lanes, end)
            .as_string(None)
        )
        # The only parameter is the validated integer lane count, rendered as a literal.
        parts.append(queries["ensure_lane_rows"].replace("%(lanes)s", str(int(store.lanes))) + ";")
    else:  # its one parameter, the version, is an integer too
        parts.append(queries["update_meta_version"].replace("%s", str(int(end))) + ";")
    if transaction:
        parts = ["BEGIN;", *parts, "COMMIT;"]
    return "\n".join(parts) + "\n"
