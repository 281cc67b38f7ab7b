"""Opening connections to a store, with driver errors translated once and secrets redacted."""

from __future__ import annotations

from typing import Any

import psycopg

from relayer.errors import StoreError
from relayer.redact import redact
from relayer.settings import StoreSettings

APPLICATION_NAME = "relayer"


def connection_kwargs(store: StoreSettings, *, autocommit: bool, name: str) -> dict[str, Any]:
    """The keyword arguments of every connection relayer opens to ``store``, named
    ``relayer:NAME`` in pg_stat_activity."""
    kwargs: dict[str, Any] = {
        "autocommit": autocommit,
        "application_name": f"{APPLICATION_NAME}:{name}"[:63],
    }
    if store.pooler == "transaction":
        # A server-side prepared statement lives on one server connection, and a transaction
        # pooler hands the next transaction to any (PgBouncer before 1.21 cannot route them).
        kwargs["prepare_threshold"] = None
    return kwargs


async def connect(
    store: StoreSettings,
    *,
    autocommit: bool = True,
    purpose: str = "relayer",
    dsn: str | None = None,
) -> psycopg.AsyncConnection[Any]:
    """An async connection to ``store``'s database (StoreError with a redacted reason);
    through ``dsn`` instead of the store's when given (its ``listen_dsn`` or ``admin_dsn``)."""
    dsn = dsn or store.require_dsn()
    try:
        return await psycopg.AsyncConnection.connect(
            dsn, **connection_kwargs(store, autocommit=autocommit, name=purpose)
        )
    except (psycopg.Error, OSError) as exc:
        raise StoreError(
            f"store {store.name!r}: cannot connect to {redact(dsn)}: {redact(str(exc)).strip()}"
        ) from exc
