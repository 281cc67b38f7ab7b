"""Hanging up on a PostgreSQL that does not answer, without asking it first.

A server that stopped answering (a blackholed network, a stalled host: the TCP connection stays
open, nothing comes back) never ends a statement waiting for its reply, and psycopg's answer
to a cancelled statement is to ask that same server to cancel it, then wait for the reply, up
to ten seconds. :func:`sever` shuts the connection's socket down on this side instead: the
statement ends at once with a driver error (the connection is then broken and replaced), and
the server rolls back the open transaction when it notices the connection is gone (or ends it
after ``idle_in_transaction_session_timeout``, three quarters of a lease). Every write of a
batch is fenced by its lease, so a batch left behind this way commits nothing.

:class:`Severance` keeps the connections a worker holds to one database, and cuts them all when
the worker's stop budget is spent (relayer.worker): a stop then ends within
``lease_duration / 2`` whatever the database does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import weakref
from collections.abc import Awaitable, Callable

from relayer.errors import StoreError
from relayer.settings import StoreSettings
from relayer.store.driver import Connection

# What opens a connection on another's behalf (Severance.connect): given how, and what for.
Guard = Callable[[Callable[[], Awaitable[Connection]], str], Awaitable[Connection]]


def sever(conn: Connection | None) -> None:
    """Shut ``conn``'s socket down in both directions, now (see the module docstring);
    nothing if it is closed already."""
    if conn is None or conn.closed:
        return
    with contextlib.suppress(OSError, ValueError):  # gone meanwhile: nothing to cut
        copy = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            copy.shutdown(socket.SHUT_RDWR)
        finally:
            copy.close()


class Severance:
    """The connections a worker holds to one database (opened through :meth:`connect`), and
    the cut that ends them all when the worker stops waiting for it (:meth:`cut`)."""

    def __init__(self, store: StoreSettings, label: str) -> None:
        self.store = store
        self.label = label  # host:port/database, as the worker's lines name it
        self._open: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._cut = asyncio.Event()

    @property
    def is_cut(self) -> bool:
        return self._cut.is_set()

    async def connect(self, make: Callable[[], Awaitable[Connection]], doing: str) -> Connection:
        """The connection ``make`` opens, kept to be cut; StoreError at once after a cut, or
        when one comes while connecting (the attempt is abandoned)."""
        if self.is_cut:
            raise self._refused(doing)
        connecting = asyncio.ensure_future(make())
        cut = asyncio.ensure_future(self._cut.wait())
        try:
            await asyncio.wait({connecting, cut}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            connecting.cancel()
            raise
        finally:
            cut.cancel()
        if not connecting.done():
            connecting.cancel()
            raise self._refused(doing)
        conn = connecting.result()
        self._open.add(conn)
        return conn

    def cut(self) -> None:
        """Sever every open connection and refuse new ones (the worker stops)."""
        self._cut.set()
        for conn in list(self._open):
            sever(conn)

    def _refused(self, doing: str) -> StoreError:
        return StoreError(
            f"store {self.store.name!r}: {doing}: the worker stopped waiting for PostgreSQL at "
            f"{self.label} (its stop budget, lease_duration / 2, is spent)"
        )
