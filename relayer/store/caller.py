"""The caller's connection: the psycopg connection behind what an application passes, and
the state of its transaction. This is the driver's edge on the application's side.

The writer and the inbox accept a psycopg ``Connection``/``AsyncConnection``, an SQLAlchemy
``Session``, ``Connection``, ``AsyncSession`` or ``AsyncConnection`` using the psycopg driver,
or Django's connection inside ``transaction.atomic()`` (relayer.django); the gateway runs
their statements (relayer.store.outbox, relayer.store.inbox) on the driver connection
underneath, inside the caller's transaction. SQLAlchemy and Django are imported only when such
an object is passed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from relayer.errors import UsageError

# A statement in flight, or a transaction not ended yet.
_OPEN = (TransactionStatus.ACTIVE, TransactionStatus.INTRANS, TransactionStatus.INERROR)
_IN_TRANSACTION = (TransactionStatus.INTRANS, TransactionStatus.INERROR)


def require_transaction(
    connection: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], what: str
) -> None:
    """Refuse an autocommit connection outside a transaction: ``what`` would commit alone."""
    if connection.autocommit and connection.info.transaction_status == TransactionStatus.IDLE:
        raise UsageError(
            f"the connection is in autocommit mode outside a transaction, so the {what} "
            "would not share a transaction with your business data; write inside "
            "`with conn.transaction():` or use a connection with autocommit off"
        )


def sync_connection(conn: Any, async_twin: str, sync_names: str) -> psycopg.Connection[Any]:
    """The sync psycopg connection of ``conn``; ``async_twin`` names the method to use instead
    for async connections, ``sync_names`` the methods being called (for the error messages).
    How to reach it is worked out once per type of ``conn`` (``_UNWRAP``): a write pays only
    the look-ups that find its connection."""
    if isinstance(conn, psycopg.Connection):
        return conn
    unwrap = _UNWRAP.get(type(conn))
    if unwrap is None:
        unwrap = _unwrapper(conn, async_twin, sync_names)
        _UNWRAP[type(conn)] = unwrap
    return unwrap(conn)


def _unwrapper(
    conn: Any, async_twin: str, sync_names: str
) -> Callable[[Any], psycopg.Connection[Any]]:
    """How to reach the psycopg connection under a ``conn`` of this type, or the UsageError
    that says why it cannot be used (never remembered)."""
    if isinstance(conn, psycopg.AsyncConnection):
        raise UsageError(f"an async psycopg connection needs {async_twin}")
    module = type(conn).__module__
    if module.startswith("django."):
        return connection_of
    if module.startswith("sqlalchemy"):
        from sqlalchemy.engine import Connection
        from sqlalchemy.orm import Session

        if isinstance(conn, Session):
            return _session_driver
        if isinstance(conn, Connection):
            return _sqlalchemy_driver
        raise UsageError(
            f"{type(conn).__name__} needs {async_twin}"
            if "asyncio" in module
            else f"cannot use an SQLAlchemy {type(conn).__name__} for {sync_names}; pass a "
            "Session or a Connection"
        )
    raise UsageError(
        f"cannot use a {type(conn).__module__}.{type(conn).__name__} for {sync_names}; pass a "
        "psycopg connection, an SQLAlchemy Session/Connection (psycopg driver) or Django's "
        "connection"
    )


def _session_driver(session: Any) -> psycopg.Connection[Any]:
    """The psycopg connection of an SQLAlchemy Session's transaction (begun if need be)."""
    return _sqlalchemy_driver(session.connection())


def _sqlalchemy_driver(conn: Any) -> psycopg.Connection[Any]:
    """The psycopg connection under an SQLAlchemy Connection. With the psycopg dialect the
    pool's DBAPI connection is the psycopg connection itself (``driver_connection``, a property
    for drivers that adapt one, costs several times more)."""
    pooled = conn.connection
    dbapi = pooled.dbapi_connection
    if isinstance(dbapi, psycopg.Connection):
        return dbapi
    driver = pooled.driver_connection
    if isinstance(driver, psycopg.Connection):
        return driver
    raise driver_error(conn.dialect.driver)


_UNWRAP: dict[type, Callable[[Any], psycopg.Connection[Any]]] = {}


async def async_connection(
    conn: Any, sync_twin: str, async_names: str
) -> psycopg.AsyncConnection[Any]:
    """The async psycopg connection of ``conn`` (see ``sync_connection``)."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    if isinstance(conn, psycopg.Connection):
        raise UsageError(f"a sync psycopg connection needs {sync_twin}")
    module = type(conn).__module__
    if module.startswith("django."):
        raise UsageError(
            f"Django's connection is synchronous: use {sync_twin} (from async code, through "
            "asgiref's sync_to_async)"
        )
    if module.startswith("sqlalchemy"):
        AsyncConnection, AsyncSession = _sqlalchemy_async()
        if isinstance(conn, AsyncSession):
            conn = await conn.connection()
        if isinstance(conn, AsyncConnection):
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            if isinstance(driver, psycopg.AsyncConnection):
                return driver
            raise driver_error(conn.dialect.driver)
        raise UsageError(
            f"an SQLAlchemy {type(conn).__name__} needs {sync_twin}"
            if "asyncio" not in module
            else f"cannot use an SQLAlchemy {type(conn).__name__} for {async_names}"
        )
    raise UsageError(
        f"cannot use a {type(conn).__module__}.{type(conn).__name__} for {async_names}; pass a "
        "psycopg AsyncConnection or an SQLAlchemy AsyncSession/AsyncConnection (psycopg driver)"
    )


@cache
def _sqlalchemy_async() -> tuple[type[Any], type[Any]]:
    """SQLAlchemy's AsyncConnection and AsyncSession, imported on first use (an import
    statement costs a write more than a look-up)."""
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    return AsyncConnection, AsyncSession


def driver_error(driver: str) -> UsageError:
    return UsageError(
        f"relayer joins SQLAlchemy transactions through the psycopg driver, but this engine uses "
        f"{driver!r}; create it with a postgresql+psycopg:// URL"
    )


def transaction_owner(conn: Any) -> Any:
    """The object whose transaction ``conn`` writes in, as SQLAlchemy's session events name it:
    an AsyncSession's sync Session, an SQLAlchemy AsyncConnection's sync Connection, otherwise
    ``conn`` itself."""
    if type(conn).__module__.startswith("sqlalchemy.ext.asyncio"):
        for attribute in ("sync_session", "sync_connection"):
            inner = getattr(conn, attribute, None)
            if inner is not None:
                return inner
    return conn


def in_transaction(conn: Any) -> bool:
    """Whether a psycopg connection is inside a transaction, working or failed (False for
    SQLAlchemy objects: their session events say when they commit)."""
    if isinstance(conn, psycopg.Connection | psycopg.AsyncConnection):
        return conn.info.transaction_status in _IN_TRANSACTION
    return False


def transaction_ended(conn: psycopg.Connection[Any] | None) -> bool | None:
    """Whether the transaction a synchronous connection was in has ended (committed, rolled
    back, or the connection closed), looked at from another thread: None when the connection
    is in use right now (its own lock is taken without blocking, so a statement in flight is
    never disturbed: look again later)."""
    if conn is None or conn.closed:
        return True
    if not conn.lock.acquire(blocking=False):
        return None
    try:
        # The status from libpq directly (conn.info builds an object and an enum each time).
        return conn.pgconn.transaction_status not in _OPEN
    finally:
        conn.lock.release()


def transaction_ended_async(conn: psycopg.AsyncConnection[Any] | None) -> bool:
    """``transaction_ended`` for an asynchronous connection, asked on its own event loop: a
    statement in flight counts as an open transaction."""
    if conn is None or conn.closed:
        return True
    return not conn.lock.locked() and conn.pgconn.transaction_status not in _OPEN


def connection_of(wrapper: Any) -> psycopg.Connection[Any]:
    """The psycopg connection under a Django connection (``django.db.connection`` or
    ``connections[alias]``), which must be inside ``transaction.atomic()``."""
    proxy, connections = _django()
    if isinstance(wrapper, proxy):
        # django.db.connection looks its connection up again at every attribute read (a
        # thread-local look-up each): once, with the alias and handler the proxy was made with.
        fields = wrapper.__dict__
        alias = fields.get("_alias")
        wrapper = fields.get("_connections", connections)[
            alias if alias is not None else wrapper.alias
        ]
    vendor = getattr(wrapper, "vendor", None)
    if vendor != "postgresql":
        raise UsageError(
            f"relayer writes outbox rows through Django's PostgreSQL backend, but this "
            f"connection's vendor is {vendor!r}; use a database whose ENGINE is "
            "'django.db.backends.postgresql'"
        )
    if not wrapper.in_atomic_block:
        raise UsageError(
            "Django's connection is in autocommit mode outside transaction.atomic(), so the "
            "outbox row would not share a transaction with your business data; write inside "
            "`with transaction.atomic():`"
        )
    raw = wrapper.connection
    if raw is None:  # inside atomic() it is connected; ensure_connection costs a check a call
        wrapper.ensure_connection()
        raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise UsageError(
            f"Django's connection uses {type(raw).__module__} (psycopg2?), but relayer needs "
            "psycopg 3 under Django: install psycopg (relayer depends on it), uninstall "
            "psycopg2, and restart"
        )
    return raw


@cache
def _django() -> tuple[type[Any], Any]:
    """Django's ConnectionProxy class and its connection handler, imported on first use."""
    from django.db import connections
    from django.utils.connection import ConnectionProxy

    return ConnectionProxy, connections
