"""The driver's edge: opening connections to a store, the connection type the gateway hands
out, and the one translation of driver errors into relayer errors.

Code outside ``relayer.store`` names connections only as :data:`Connection`, opens them only
with :func:`connect` and catches only relayer errors; every psycopg, socket and pool error
that the gateway handles is turned into a relayer error here or in the gateway module that ran
the statement (:func:`translated`), with a redacted message and the original chained
(``raise ... from exc``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

import psycopg

from relayer.errors import RelayerError, StoreError
from relayer.redact import redact
from relayer.settings import StoreSettings

Connection: TypeAlias = psycopg.AsyncConnection[Any]
"""A connection the gateway opened or lent (autocommit or not, as the gateway says)."""

APPLICATION_NAME = "relayer"

# What talking to PostgreSQL can raise besides relayer's own errors: every driver error (a
# pool's PoolTimeout and PoolClosed are psycopg errors too) and socket errors.
DRIVER_ERRORS: tuple[type[Exception], ...] = (psycopg.Error, OSError)


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
) -> Connection:
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


def failure(store: StoreSettings, doing: str, exc: BaseException) -> str:
    """What a StoreError says about ``exc`` (a driver or socket error): the store, what
    failed and the driver's reason, redacted."""
    reason = redact(str(exc)).strip() or type(exc).__name__
    return f"store {store.name!r}: {doing} failed: {reason}"


def store_error(store: StoreSettings, doing: str, exc: BaseException) -> StoreError:
    """``exc`` (a driver or socket error) as a StoreError naming the store and what failed."""
    return StoreError(failure(store, doing, exc))


@contextmanager
def translated(
    store: StoreSettings, doing: str, error: type[RelayerError] = StoreError
) -> Iterator[None]:
    """Raise driver errors of the block as StoreError, or as ``error`` where callers expect
    another relayer error (relayer errors pass unchanged)."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise error(failure(store, doing, exc)) from exc


def verbatim_error(exc: BaseException) -> StoreError:
    """``exc`` (a driver or socket error) as a StoreError in the driver's own words, redacted
    and without a prefix: the operator commands and the dashboard show the server's message as
    it came (a line of ``status --all``, a page's error), where the store is named already."""
    return StoreError(redact(str(exc)).strip() or type(exc).__name__)


@contextmanager
def translated_verbatim() -> Iterator[None]:
    """Raise driver errors of the block as :func:`verbatim_error` (relayer errors pass
    unchanged)."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise verbatim_error(exc) from exc


def is_broken(conn: Connection | None) -> bool:
    """True when ``conn`` cannot be used again (the caller forgets it and reconnects)."""
    return conn is None or conn.closed or conn.broken


# How long hang_up waits for the server to end a closed connection's process.
HANG_UP_WITHIN = 1.0


async def hang_up(conn: Connection, within: float = HANG_UP_WITHIN) -> None:
    """Close ``conn`` and wait, at most ``within`` seconds, until the server has hung up.

    A server process leaves pg_stat_activity before it closes its socket, so once the socket
    reads end-of-file the connection no longer counts there: one opened next in its place
    (within a worker's connection budget) never shows beside it. A copy of the socket is kept
    open across the close to see that end-of-file.
    """
    copy = -1
    with contextlib.suppress(*DRIVER_ERRORS):
        if not conn.closed:
            copy = os.dup(conn.pgconn.socket)
    with contextlib.suppress(*DRIVER_ERRORS):
        await conn.close()
    if copy < 0:
        return
    sock = socket.socket(fileno=copy)
    try:
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(within):
            while await loop.sock_recv(sock, 4096):
                pass  # what the server still sends (a TLS close_notify): until it hangs up
    except (TimeoutError, OSError):
        pass  # unreachable, or gone already: nothing more to wait for
    finally:
        sock.close()
