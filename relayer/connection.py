"""Opening connections to a store, with driver errors translated once and secrets redacted."""

from __future__ import annotations

from typing import Any

import psycopg

from relayer.errors import StoreError
from relayer.redact import redact
from relayer.settings import StoreSettings

APPLICATION_NAME = "relayer"


async def connect(
    store: StoreSettings, *, autocommit: bool = True, purpose: str = "relayer"
) -> psycopg.AsyncConnection[Any]:
    """An async connection to ``store``'s database (StoreError with a redacted reason)."""
    dsn = store.require_dsn()
    try:
        return await psycopg.AsyncConnection.connect(
            dsn, autocommit=autocommit, application_name=f"{APPLICATION_NAME}:{purpose}"[:63]
        )
    except (psycopg.Error, OSError) as exc:
        raise StoreError(
            f"store {store.name!r}: cannot connect to {redact(dsn)}: {redact(str(exc)).strip()}"
        ) from exc
