"""``relayer schema print|apply|check``: a store's schema as an operator sees it.

:func:`render` prints the DDL script ``apply`` would run on an empty database, for a DBA to
review. Everything that reads or changes the database is the gateway's
(:mod:`relayer.store.schema`: metadata, ``apply``; :mod:`relayer.store.drift`: ``check`` and
the worker's ``require_meta``) and is named here too, with the migrations
(:func:`relayer.sql.migrations`), for the commands and tools that use them.
"""

from __future__ import annotations

from psycopg import sql

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


def render(store: StoreSettings) -> str:
    """The whole DDL script ``apply`` would run on an empty database, for a DBA to review."""
    names = store.names
    queries = queries_for(names)
    parts = [
        "BEGIN;",
        queries["pin_search_path"] + ";",
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
