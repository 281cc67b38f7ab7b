"""Reading a template's catalog: the operator's query that lists its stores (relayer.fleet).

The query is the operator's own SQL, taken from the settings as written: it runs read-only,
under a statement timeout, on a connection opened for the read and closed after it (one read
per ``discover_interval``). Driver errors become StoreError with a redacted message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg

from relayer.errors import StoreError
from relayer.redact import redact
from relayer.store.driver import APPLICATION_NAME, DRIVER_ERRORS, hang_up

# The transaction's own statement timeout (SET LOCAL), as a bound value.
SET_TIMEOUT: LiteralString = "SELECT pg_catalog.set_config('statement_timeout', %s, true)"


@dataclass(frozen=True, slots=True)
class CatalogRows:
    """What the query returned: its column names and rows, as the driver decoded them."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


async def read_catalog(dsn: str, query: str, *, within: float, purpose: str) -> CatalogRows:
    """Run ``query`` on ``dsn`` in a read-only transaction that ends within ``within``
    seconds (StoreError naming ``purpose`` on any failure)."""
    doing = f"{purpose}: reading the catalog at {redact(dsn)}"
    try:
        conn = await psycopg.AsyncConnection.connect(
            dsn,
            autocommit=False,
            # One statement per refresh, through any pooler: nothing to gain from preparing.
            prepare_threshold=None,
            application_name=f"{APPLICATION_NAME}:{purpose}"[:63],
            connect_timeout=max(1, round(within)),
        )
    except DRIVER_ERRORS as exc:
        raise StoreError(f"{doing} failed: cannot connect: {_reason(exc)}") from exc
    try:
        await conn.set_read_only(True)
        await conn.execute(SET_TIMEOUT, (f"{max(1, int(within * 1000))}ms",))
        # The operator's query from the settings, sent as given (bytes: not a literal here).
        cursor = await conn.execute(query.encode())
        if cursor.description is None:
            raise StoreError(
                f"{doing} failed: the query returns no rows (it is not a SELECT); give a "
                "SELECT whose columns are name and any of dsn, schema, table_prefix, weight, "
                "concurrency_limit"
            )
        columns = tuple(column.name for column in cursor.description)
        rows = tuple(tuple(row) for row in await cursor.fetchall())
        await conn.rollback()
    except DRIVER_ERRORS as exc:
        raise StoreError(f"{doing} failed: {_reason(exc)}") from exc
    finally:
        await hang_up(conn)  # gone from the server once this returns: see Databases.outside
    return CatalogRows(columns, rows)


def _reason(exc: BaseException) -> str:
    return redact(str(exc)).strip().replace("\n", "; ") or type(exc).__name__
