"""The SQL relayer runs: named queries and numbered migrations, parsed once, composed per
store with validated identifiers. This package runs nothing: ``relayer.store`` does (the
writer's and the inbox's statements too, on the application's connection).

Every statement lives in a named-query file of this package (``queries.sql`` for the core,
``relay.sql``, ``dispatch.sql``, ``schema.sql``, ...) or in a numbered migration
(``relayer/migrations/NNNN_name.sql``, see :func:`migrations`). Identifiers (schema, tables,
indexes) enter only through ``psycopg.sql.Identifier``; values are always bound parameters.

Built-in functions and catalog relations are written qualified (``pg_catalog.now()``,
``pg_catalog.pg_locks``) so that no schema placed ahead of ``pg_catalog`` in a role's or
database's search_path can stand in for them; the writer's statements, which run under the
application's search_path, qualify their types and operators as well. Migrations run with the
search_path pinned (the ``pin_search_path`` query) instead.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import LiteralString

from psycopg import sql

from relayer.identifiers import FUNCTION_SUFFIXES, INDEX_SUFFIXES, TABLE_SUFFIXES, StoreNames

_MIGRATION_FILE = re.compile(r"(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql")
_HEADER = re.compile(r"^-- name: (?P<name>[a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Split a named-query file into {name: statement}."""
    queries: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        if match["name"] in queries:
            raise ValueError(f"query {match['name']!r} is defined twice")
        queries[match["name"]] = body
    return queries


_FRAGMENT = re.compile(r"\{(_[a-z0-9_]+)\}")


@cache
def raw_queries() -> dict[str, str]:
    """Every named query of every ``*.sql`` file in this package (names are unique overall).

    A name starting with ``_`` is a fragment, not a query: its text (without its leading
    comment lines) replaces ``{_name}`` in the queries and fragments that use it, before
    identifiers are composed, so that the same logic is written once.
    """
    queries = _named_texts()
    fragments = {
        name: "\n".join(line for line in _without_leading_comments(text.splitlines()))
        for name, text in queries.items()
        if name.startswith("_")
    }

    def paste(match: re.Match[str], depth: int = 0) -> str:
        if match[1] not in fragments:
            raise ValueError(f"unknown SQL fragment {match[1]!r}")
        if depth > 8:
            raise ValueError(f"SQL fragment {match[1]!r} pastes itself")
        return _FRAGMENT.sub(lambda inner: paste(inner, depth + 1), fragments[match[1]])

    return {
        name: _FRAGMENT.sub(paste, text)
        for name, text in queries.items()
        if not name.startswith("_")
    }


def _without_leading_comments(lines: list[str]) -> list[str]:
    start = 0
    while start < len(lines) and lines[start].lstrip().startswith("--"):
        start += 1
    return lines[start:]


def _named_texts() -> dict[str, str]:
    queries: dict[str, str] = {}
    files = sorted(
        (entry for entry in resources.files(__package__).iterdir() if entry.name.endswith(".sql")),
        key=lambda entry: entry.name,
    )
    for entry in files:
        for name, text in parse_queries(entry.read_text("utf-8")).items():
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice ({entry.name})")
            queries[name] = text
    return queries


def identifiers(names: StoreNames) -> dict[str, sql.Composable]:
    """The placeholder values for a store: ``{schema}``, every table, index and function, and
    the ``{channel}`` writers NOTIFY."""
    values: dict[str, sql.Composable] = {
        "schema": sql.Identifier(names.schema),
        "channel": sql.Identifier(names.notify_channel),
    }
    for role in TABLE_SUFFIXES:
        values[role] = sql.Identifier(names.schema, names.table(role))
    for role in INDEX_SUFFIXES:
        # CREATE INDEX takes an unqualified name: the index lives in its table's schema.
        values[role] = sql.Identifier(names.index(role))
    for role in FUNCTION_SUFFIXES:
        values[role] = sql.Identifier(names.schema, names.function(role))
    return values


def compose(
    template: str, names: StoreNames, values: dict[str, sql.Composable] | None = None
) -> sql.Composed:
    """Compose a statement template with the store's identifiers (``values``: identifiers(names)
    made already, for a caller composing many statements)."""
    return sql.SQL(template).format(**(identifiers(names) if values is None else values))


# Named queries that name a table known only when they run (beside the store's own tables):
# the placeholders each takes, composed by compose_with().
RUNTIME_IDENTIFIERS: dict[str, tuple[str, ...]] = {"partitioned_rescue": ("partition",)}


def compose_with(name: str, names: StoreNames, **tables: sql.Composable) -> sql.Composed:
    """The named query ``name`` of RUNTIME_IDENTIFIERS composed with the store's identifiers
    and ``tables`` (one per placeholder it takes)."""
    if set(tables) != set(RUNTIME_IDENTIFIERS[name]):
        raise ValueError(f"query {name!r} takes {RUNTIME_IDENTIFIERS[name]}, given {tuple(tables)}")
    return compose(raw_queries()[name], names, {**identifiers(names), **tables})


# The named queries partitioned storage runs in place of delete mode's have this prefix
# (relayer/sql/partitioned.sql, docs/storage.md).
PARTITIONED = "partitioned_"


class Queries:
    """Every named query of one store, each composed and rendered to text the first time it is
    asked for (KeyError for a name no file defines). ``storage``: the store's storage mode;
    with "partitioned", a name that has a partitioned version (``partitioned_<name>``) gives
    that version."""

    def __init__(self, names: StoreNames, storage: str = "delete") -> None:
        self.names = names
        self.storage = storage
        # A worker joining hundreds of stores makes every store's Queries, and each store uses
        # a fraction of them: composing them all up front took a sixth of a joining worker's
        # CPU. The store's identifiers are made once, not once per query.
        self._values: dict[str, sql.Composable] | None = None
        self._rendered: dict[str, LiteralString] = {}

    def __getitem__(self, name: str) -> LiteralString:
        if self.storage == "partitioned" and PARTITIONED + name in raw_queries():
            name = PARTITIONED + name
        found = self._rendered.get(name)
        if found is None:
            template = raw_queries()[name]
            if self._values is None:
                self._values = identifiers(self.names)
            rendered = compose(template, self.names, self._values).as_string(None)
            found = self._rendered[name] = _without_comment_lines(rendered)
        return found


def _without_comment_lines(statement: str) -> LiteralString:
    """The statement without its whole-line ``--`` comments (they document the SQL files),
    its indentation and its blank lines.

    psycopg caches the parsing of a statement's placeholders only for statements of at most
    4,096 bytes; the outcome statement's comments alone would push it past that, and parsing it
    again on every batch costs more than the statement's round trip. Only whole comment lines
    and the spaces around lines go: no statement has a string literal spanning lines.
    """
    kept = (line.strip() for line in statement.splitlines())
    return "\n".join(line for line in kept if line and not line.startswith("--"))


@cache
def queries_for(names: StoreNames, storage: str = "delete") -> Queries:
    """The named queries of the store of ``names`` whose storage mode is ``storage``."""
    return Queries(names, storage)


@dataclass(frozen=True, slots=True)
class Migration:
    """One numbered migration: its DDL template ({placeholders} as in the named queries)."""

    version: int
    name: str
    template: str

    @property
    def checksum(self) -> str:
        return _checksum(self.template)

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


@cache
def _checksum(template: str) -> str:
    # Cached: a worker checks the recorded checksums of every store that joins it.
    return hashlib.sha256(template.encode("utf-8")).hexdigest()[:16]


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
    """The schema version this relayer creates: its last migration's."""
    return migrations()[-1].version
