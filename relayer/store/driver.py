"""The driver's edge: the connection type the gateway hands out and the one translation of
driver errors into :class:`~relayer.errors.StoreError`.

Code outside ``relayer.store`` names connections only as :data:`Connection` and catches only
relayer errors; every psycopg, socket and pool error is turned into a StoreError here, with a
redacted message and the original chained (``raise ... from exc``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import psycopg

from relayer.errors import StoreError
from relayer.redact import redact
from relayer.settings import StoreSettings

Connection: TypeAlias = psycopg.AsyncConnection[Any]
"""A connection the gateway opened or lent (autocommit or not, as the gateway says)."""

# What talking to PostgreSQL can raise besides relayer's own errors: every driver error (a
# pool's PoolTimeout and PoolClosed are psycopg errors too) and socket errors.
DRIVER_ERRORS: tuple[type[Exception], ...] = (psycopg.Error, OSError)


def store_error(store: StoreSettings, doing: str, exc: BaseException) -> StoreError:
    """``exc`` (a driver or socket error) as a StoreError naming the store and what failed."""
    reason = redact(str(exc)).strip() or type(exc).__name__
    return StoreError(f"store {store.name!r}: {doing} failed: {reason}")


@contextmanager
def translated(store: StoreSettings, doing: str) -> Iterator[None]:
    """Raise driver errors of the block as StoreError (relayer errors pass unchanged)."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise store_error(store, doing, exc) from exc


def is_broken(conn: Connection | None) -> bool:
    """True when ``conn`` cannot be used again (the caller forgets it and reconnects)."""
    return conn is None or conn.closed or conn.broken
