"""The least privileges of each kind of role that uses a store, as GRANT statements.

Three kinds: the **writer** (the application's role: ``Outbox.write`` in its transactions), the
**worker** (``relayer run``) and the **operator** (``relayer status``, ``parked``, ``queue``).
``relayer schema apply`` and ``schema check`` are run by the tables' owner, who needs no grant.
The statements are composed with ``psycopg.sql.Identifier``, so any role name is quoted safely.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from psycopg import sql

from relayer.errors import ConfigurationError
from relayer.identifiers import POSTGRES_NAME_LIMIT
from relayer.settings import StoreSettings

Kind = Literal["writer", "worker", "operator"]
KINDS: tuple[Kind, ...] = ("writer", "worker", "operator")

_ALL = ("SELECT", "INSERT", "UPDATE", "DELETE")
# Per kind: table role -> privileges. UPDATE also stands for the row locks (SELECT ... FOR
# UPDATE) a role takes without changing the row.
_TABLES: Mapping[Kind, Mapping[str, tuple[str, ...]]] = {
    "writer": {"meta": ("SELECT",), "outbox": ("INSERT",)},
    "worker": {
        "meta": ("SELECT",),
        "migrations": ("SELECT",),  # the drift check at start
        "leases": _ALL,
        "outbox": ("SELECT", "UPDATE", "DELETE"),
        "parked": _ALL,
        "queues": ("SELECT",),
        "inbox": ("SELECT", "UPDATE", "DELETE"),  # retention (docs/inbox.md)
        "inbox_keys": ("SELECT", "UPDATE", "DELETE"),
        "sequences": ("SELECT", "UPDATE", "DELETE"),
    },
    "operator": {
        "meta": ("SELECT",),
        "leases": ("SELECT", "UPDATE"),  # a parked-key change locks its lane's lease row
        "outbox": ("SELECT", "UPDATE", "DELETE"),
        "parked": ("SELECT", "DELETE"),
        "queues": ("SELECT", "INSERT", "UPDATE"),
        "queue_events": ("SELECT", "INSERT"),
        "audit": ("SELECT", "INSERT"),  # every parked-key change is recorded (dashboard too)
    },
}
# With storage = "partitioned" (docs/storage.md), besides: each lane's progress and the held
# rows. Rotation creates, attaches, detaches and drops partitions: the tables' owner does it,
# through admin_dsn (no grant gives it).
_PARTITIONED: Mapping[Kind, Mapping[str, tuple[str, ...]]] = {
    "writer": {},
    "worker": {"progress": ("SELECT", "INSERT", "UPDATE"), "held": _ALL},
    "operator": {"progress": ("SELECT",), "held": ("SELECT", "UPDATE", "DELETE")},
}
# The argument types of the dispatch claim function (migration 0005), which a GRANT names.
CLAIM_SLOTS_ARGUMENTS = (
    "boolean, boolean[], integer[], integer[], integer[], integer, integer[], integer[], "
    "integer[], integer[]"
)
# The writer numbers each key's messages in this table when sequence_numbers is on.
_SEQUENCES = ("SELECT", "INSERT", "UPDATE")


def check_role(role: str) -> str:
    """``role`` if PostgreSQL reads it, quoted, as that role: not empty, at most 63 bytes (a
    longer name is cut to its first 63, which may name another role) and not ``public`` (which
    ``TO "public"`` reads as PUBLIC, every role)."""
    size = len(role.encode("utf-8"))
    if not 0 < size <= POSTGRES_NAME_LIMIT or role.lower() == "public":
        raise ConfigurationError(
            "--role",
            role,
            f"must be the name of an existing role: 1 to {POSTGRES_NAME_LIMIT} bytes "
            f"(PostgreSQL reads only the first {POSTGRES_NAME_LIMIT} bytes of a longer name, "
            "which may name another role), and not 'public' in any case (GRANT ... TO "
            '"public" grants to every role)',
        )
    return role


def statements(store: StoreSettings, kind: Kind, role: str) -> list[sql.Composed]:
    """The GRANT statements ``role`` needs to act as ``kind`` on ``store``."""
    names = store.names
    grantee = sql.Identifier(check_role(role))
    database = _database(store)
    found: list[sql.Composed] = []
    if database is not None:
        found.append(
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database), grantee)
        )
    found.append(
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(names.schema), grantee)
    )
    tables = dict(_TABLES[kind])
    if store.storage == "partitioned":
        tables.update(_PARTITIONED[kind])
    if kind == "writer" and store.sequence_numbers:
        tables["sequences"] = _SEQUENCES
    for table, privileges in tables.items():
        found.append(
            sql.SQL("GRANT {} ON TABLE {} TO {}").format(
                sql.SQL(", ").join(sql.SQL(privilege) for privilege in privileges),
                sql.Identifier(names.schema, names.table(table)),
                grantee,
            )
        )
    if kind == "worker":
        found.append(
            sql.SQL("GRANT EXECUTE ON FUNCTION {}({}) TO {}").format(
                sql.Identifier(names.schema, names.function("claim_slots")),
                sql.SQL(CLAIM_SLOTS_ARGUMENTS),
                grantee,
            )
        )
    return found


def render(store: StoreSettings, kind: Kind, role: str) -> str:
    """The statements as a script for ``psql``, with a line saying what they are for."""
    lines = [f"-- {kind} of store {store.name!r} ({store.db_schema}.{store.table_prefix}*)"]
    if _database(store) is None:
        lines.append("-- and GRANT CONNECT ON DATABASE <the store's database> (its DSN names none)")
    lines.extend(statement.as_string(None) + ";" for statement in statements(store, kind, role))
    return "\n".join(lines) + "\n"


def _database(store: StoreSettings) -> str | None:
    """The database the store's DSN names (libpq's default: the user's name), if any."""
    if not store.dsn:
        return None
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(store.dsn)
    database = parts.get("dbname") or parts.get("user")
    return str(database) if database else None
