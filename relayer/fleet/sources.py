"""Reading a template's discovery source: the rows that name its stores.

A file is read whole each time: ``.toml`` holds ``[[stores]]`` tables, ``.json`` an array of
objects (or an object whose ``stores`` is that array). A query returns one row per store, its
columns named after the row's fields. Either way each row is a :class:`DiscoveredRow`, or,
when it cannot be one (not a table, an unknown field), the ConfigurationError that says why:
that row is skipped, the others are served. A source that cannot be read at all raises
DiscoveryError, and the stores found last stay as they are.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from relayer.errors import ConfigurationError, RelayerError, StoreError
from relayer.fleet.templates import ROW_FIELDS, Row, row_from_mapping, store_from_row
from relayer.settings import StoreSettings, TemplateSettings
from relayer.store.catalog import read_catalog

# A catalog query must end within this many seconds (and within the refresh interval).
QUERY_TIMEOUT = 30.0


class DiscoveryError(RelayerError):
    """A discovery source could not be read; the message says what to fix."""


async def read_source(template: TemplateSettings) -> list[Row]:
    """The rows ``template``'s source yields now (DiscoveryError if it cannot be read)."""
    discovery = template.discovery
    if discovery.file is not None:
        return await asyncio.to_thread(read_file, discovery.file)
    assert discovery.query is not None  # DiscoverySettings requires one of them
    dsn = template.catalog_dsn()
    if dsn is None:  # RelayerSettings requires one; a template built by hand may lack it
        raise DiscoveryError(
            f"template {template.name}: a query source needs a catalog database; set "
            f"templates.{template.name}.discovery.dsn"
        )
    timeout = min(QUERY_TIMEOUT, template.discover_interval.total_seconds())
    try:
        found = await read_catalog(
            dsn, discovery.query, within=timeout, purpose=f"discovery:{template.name}"
        )
    except StoreError as exc:
        raise DiscoveryError(
            f"{exc}; check that the catalog database is reachable and that "
            f"templates.{template.name}.discovery.query runs there"
        ) from exc
    return rows_from_columns(template.name, found.columns, found.rows)


def rows_from_columns(
    template: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
) -> list[Row]:
    """A query's rows by column name; a column that is no row field fails the whole read."""
    unknown = [column for column in columns if column not in ROW_FIELDS]
    if unknown or "name" not in columns:
        problem = (
            f"returns column {unknown[0]!r}, which is not a field of a discovery row"
            if unknown
            else "returns no column 'name'"
        )
        raise DiscoveryError(
            f"template {template}: the catalog query {problem} (fields: "
            f"{', '.join(ROW_FIELDS)}); name its columns after them (... AS schema)"
        )
    return [
        _row(dict(zip(columns, row, strict=True)), f"row {number}")
        for number, row in enumerate(rows, 1)
    ]


def read_file(path: Path) -> list[Row]:
    """The rows of a discovery file (DiscoveryError if it cannot be read or parsed)."""
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise DiscoveryError(
            f"discovery file {path} does not exist; create it (relative paths start from the "
            "worker's working directory) or fix discovery.file"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DiscoveryError(f"discovery file {path} cannot be read: {exc}") from None
    if path.suffix.lower() == ".json":
        try:
            data: Any = json.loads(text)
        except ValueError as exc:
            raise DiscoveryError(f"discovery file {path} is not valid JSON: {exc}") from None
        if isinstance(data, Mapping) and set(data) == {"stores"}:
            data = data["stores"]
        if not isinstance(data, list):
            raise DiscoveryError(
                f"discovery file {path} must hold an array of objects, one per store "
                '([{"name": "acme", "schema": "acme"}, ...])'
            )
        entries: list[Any] = data
    else:
        try:
            table = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise DiscoveryError(f"discovery file {path} is not valid TOML: {exc}") from None
        stores = table.get("stores", [])
        if set(table) - {"stores"} or not isinstance(stores, list):
            raise DiscoveryError(
                f"discovery file {path} must hold only [[stores]] tables, one per store "
                "([[stores]] then name = 'acme', schema = 'acme', ...)"
            )
        entries = stores
    return [_row(entry, f"row {number}") for number, entry in enumerate(entries, 1)]


def _row(entry: object, where: str) -> Row:
    if not isinstance(entry, Mapping):
        return ConfigurationError(where, entry, "must be a table (an object) naming one store")
    try:
        return row_from_mapping(entry, where)
    except ConfigurationError as exc:
        return exc


def find_store(template: TemplateSettings, name: str) -> StoreSettings:
    """Store ``name`` (``TEMPLATE.NAME``) as ``template``'s source yields it now, for the
    commands that act on one store (``relayer schema apply tenants.acme``, ``status``...).
    ConfigurationError when the source does not list it or its row breaks a rule;
    DiscoveryError when the source cannot be read. Safe to call on a running event loop (the
    read runs on a thread of its own)."""
    with ThreadPoolExecutor(1, thread_name_prefix="relayer-discovery") as thread:
        rows = thread.submit(asyncio.run, read_source(template)).result()
    wanted = name.removeprefix(f"{template.name}.")
    listed: list[str] = []
    for row in rows:
        if isinstance(row, ConfigurationError):
            continue
        if row.name == wanted:
            return store_from_row(template, row).settings
        listed.append(f"{template.name}.{row.name}")
    shown = ", ".join(listed[:10]) + (", ..." if len(listed) > 10 else "") or "none"
    raise ConfigurationError(
        "store",
        name,
        f"is not listed by the source of template {template.name} "
        f"({template.discovery.describe()}; it lists: {shown}); add its row there, or name a "
        "configured store",
    )
