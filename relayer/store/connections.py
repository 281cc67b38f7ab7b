"""The connections a worker keeps to a store, owned by the gateway so that no caller handles
driver errors: a pool of transaction connections (lane batches, maintenance, after-commit
dispatch), single autocommit sessions (heartbeats, probes) and the LISTEN connection.

Each hands out a :data:`~relayer.store.driver.Connection` inside an ``async with`` block and
raises StoreError, never a driver error, for trouble getting or using it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol

from psycopg_pool import AsyncConnectionPool

from relayer.deadlines import Deadlines
from relayer.errors import DatabaseSilentError, StoreError
from relayer.pooler import idle_timeout_setting
from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.store.driver import (
    DRIVER_ERRORS,
    Connection,
    connect,
    connection_kwargs,
    hang_up,
    is_broken,
    store_error,
    translated,
)
from relayer.store.severance import sever

Connect = Callable[[], Awaitable[Connection]]
Settings = Mapping[str, str]


def unordered_settings(store: StoreSettings) -> Settings:
    """The server settings of transactions that hold claimed rows while they publish: ended
    by the server past three quarters of a lease idle (relayer.pooler.idle_timeout), so the
    rows of a silently partitioned sender are not locked for hours."""
    return {"idle_in_transaction_session_timeout": idle_timeout_setting(store.lease_duration)}


def batch_settings(store: StoreSettings) -> Settings:
    """The server settings of lane batch transactions (and the maintenance on their pool).

    A batch's commit records deletes of rows the broker already has: losing it in a server
    crash only sends those rows again (at-least-once holds), so it need not wait for the WAL
    flush. No bitmap scans: a lane's rows are inserted and deleted all day; an ordered index
    scan marks the entries of deleted rows dead as it passes them (later scans skip them), a
    bitmap scan does not, so each read would walk every row the lane lost since the last vacuum
    (about a fifth more database CPU per batch). And the idle limit of unordered_settings: a
    batch holds its lanes' lease rows locked.
    """
    settings = {
        "synchronous_commit": "off",
        "enable_bitmapscan": "off",
        **unordered_settings(store),
    }
    if store.storage == "partitioned":
        # A custom plan prunes partitions when it is made, so PostgreSQL keeps planning the
        # batch statements anew (about 10 ms of planning per batch); a generic plan prunes
        # them at run time, as each lane's progress is known.
        settings["plan_cache_mode"] = "force_generic_plan"
    return settings


def local_settings(store: StoreSettings, settings: Settings) -> dict[str, list[str]] | None:
    """The parameters of the ``set_local`` statement a transaction runs first behind a
    transaction pooler, or None when the pool's start-up options carry ``settings``."""
    if store.pooler == "none":
        return None
    return {"names": list(settings), "values": list(settings.values())}


class Transactions(Protocol):
    """What lends connections for transactions (autocommit off): a StorePool, or a worker's
    shared pool as one store uses it (relayer.store.budget.StoreConnections)."""

    def connection(
        self, doing: str = "", *, wait: float | None = None
    ) -> AbstractAsyncContextManager[Connection]: ...


class StorePool:
    """A pool of connections to one store, autocommit off, for transactions.

    ``connection()`` lends one for a block; a PoolTimeout (no connection free within
    ``timeout``), a closed pool or a driver error anywhere in the block is a StoreError.

    ``settings`` (name -> value) are the server settings of every transaction on the pool:
    given at connect as start-up options, except behind a transaction pooler (which refuses
    them and would not keep them), where each transaction that needs them sets them itself
    (:func:`local_settings`).
    """

    def __init__(
        self,
        store: StoreSettings,
        *,
        purpose: str,
        max_size: int,
        timeout: float = 30.0,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.purpose = purpose
        kwargs = connection_kwargs(store, autocommit=False, name=f"{store.name}:{purpose}")
        if settings and store.pooler == "none":
            kwargs["options"] = " ".join(f"-c {name}={value}" for name, value in settings.items())
        self._pool: AsyncConnectionPool = AsyncConnectionPool(
            store.require_dsn(),
            min_size=1,
            max_size=max_size,
            open=False,
            timeout=timeout,
            kwargs=kwargs,
            name=f"relayer-{store.name}-{purpose}",
        )

    @property
    def closed(self) -> bool:
        return self._pool.closed

    @property
    def max_size(self) -> int:
        return self._pool.max_size

    async def open(self, *, connections: int = 1, within: float = 30.0) -> None:
        """Open the pool with ``connections`` ready (StoreError if they cannot be made
        ``within`` that many seconds)."""
        with translated(self.store, f"open the {self.purpose} connections"):
            await self._pool.open(wait=True, timeout=within)
            if connections != self._pool.min_size:
                await self.resize(connections)
                await self._pool.wait(timeout=within)

    async def resize(self, connections: int) -> None:
        """Keep ``connections`` open (at most ``max_size``)."""
        with translated(self.store, f"resize the {self.purpose} connections"):
            await self._pool.resize(min(max(connections, 1), self.max_size), self.max_size)

    @asynccontextmanager
    async def connection(
        self, doing: str = "", *, wait: float | None = None
    ) -> AsyncIterator[Connection]:
        """A connection for one transaction, waiting at most ``wait`` seconds for one (default:
        the pool's timeout); returned (rolled back if left open) at the end."""
        try:
            async with self._pool.connection(timeout=wait) as conn:
                yield conn
        except DRIVER_ERRORS as exc:
            raise store_error(self.store, doing or f"a {self.purpose} connection", exc) from exc

    async def close(self) -> None:
        with translated(self.store, f"close the {self.purpose} connections"):
            await self._pool.close()


class Session:
    """One autocommit connection to a store kept between uses: opened on first use, and closed
    and forgotten after any failure in a use, so that the next use reconnects.

    Uses take turns (``connection()`` holds the connection for its block), first come first
    served, except that ``urgent`` uses (heartbeats) go before every waiting ordinary one
    (probes): a heartbeat that waits for the probes of many stores could let the member expire.
    ``connect`` opens the connection; by default an autocommit connection named after
    ``purpose``. :meth:`for_store` shares it with another store of the same database.
    """

    def __init__(
        self, store: StoreSettings, connect: Connect | None = None, *, purpose: str = "control"
    ) -> None:
        self.store = store
        self.purpose = purpose
        self._shared = _SessionState(connect or self._open)
        self._owner = True

    async def _open(self) -> Connection:
        return await connect(self.store, purpose=f"{self.store.name}:{self.purpose}")

    def keep_prepared(self, count: int) -> None:
        """How many statements the connection keeps prepared at most (psycopg's
        ``prepared_max``), now and after a reconnect."""
        self._shared.prepared_max = count
        if not is_broken(self._shared.conn):
            self._shared.conn.prepared_max = count  # type: ignore[union-attr]

    def for_store(self, store: StoreSettings) -> Session:
        """This session's connection as ``store`` uses it: errors name ``store``, and its
        ``close`` leaves the connection to the owner (the other stores keep using it)."""
        view = Session.__new__(Session)
        view.store = store
        view.purpose = self.purpose
        view._shared = self._shared
        view._owner = False
        return view

    @asynccontextmanager
    async def connection(
        self, doing: str, *, urgent: bool = False, within: float | None = None
    ) -> AsyncIterator[Connection]:
        """The connection for a block (StoreError for a driver error in it).

        ``within``: seconds the block may wait for PostgreSQL, its turn and a connection
        included (heartbeats). Past them the connection is severed (relayer.store.severance:
        a silent server is not asked to cancel anything) and DatabaseSilentError raised.
        Connecting is bounded in any case, by a quarter of a lease."""
        shared = self._shared
        loop = asyncio.get_running_loop()
        deadline = None if within is None else loop.time() + within
        timer = None if deadline is None else loop.call_at(deadline, shared.sever)
        try:
            async with shared.turns.turn(urgent, deadline=deadline):
                try:
                    yield await self._connected(doing, deadline, within)
                except DRIVER_ERRORS as exc:
                    await shared.forget()
                    if deadline is not None and loop.time() >= deadline:
                        raise self._silent(doing, within) from exc
                    raise store_error(self.store, doing, exc) from exc
                except BaseException:
                    # A failed or interrupted statement can leave the connection busy or
                    # broken: the next use starts on a fresh one.
                    await shared.forget()
                    raise
        except TimeoutError as exc:  # no turn within ``within``: the holder's use is silent
            raise self._silent(doing, within) from exc
        finally:
            if timer is not None:
                timer.cancel()

    async def _connected(
        self, doing: str, deadline: float | None, within: float | None
    ) -> Connection:
        """The open connection, connecting first if there is none (within a quarter of a
        lease, and by ``deadline``)."""
        shared = self._shared
        if not is_broken(shared.conn):
            assert shared.conn is not None
            return shared.conn
        shared.conn = None
        loop = asyncio.get_running_loop()
        limit = Deadlines.of(self.store.lease_duration).connection_wait
        bound = loop.time() + limit
        silent = deadline is not None and deadline <= bound
        try:
            async with asyncio.timeout_at(deadline if silent else bound):
                with translated(self.store, f"{doing} (connecting)"):
                    conn = await shared.connect()
        except TimeoutError as exc:
            if silent:
                raise self._silent(doing, within) from exc
            raise StoreError(
                f"store {self.store.name!r}: {doing} (connecting): PostgreSQL did not answer "
                f"within {limit:g} s"
            ) from exc
        if shared.prepared_max is not None:
            conn.prepared_max = shared.prepared_max
        shared.conn = conn
        return conn

    def _silent(self, doing: str, within: float | None) -> DatabaseSilentError:
        return DatabaseSilentError(
            f"store {self.store.name!r}: {doing}: PostgreSQL answered nothing within "
            f"{within or 0:g} s; the connection was closed"
        )

    @property
    def backend_pid(self) -> int | None:
        """The server process of the open connection, if any (tests and diagnostics); None
        behind a transaction pooler, which reports a number of its own."""
        conn = self._shared.conn
        if is_broken(conn) or self.store.pooler == "transaction":
            return None
        return conn.info.backend_pid  # type: ignore[union-attr]

    async def close(self) -> None:
        """Close the connection (a shared one only through its owner: see for_store)."""
        if not self._owner:
            return
        async with self._shared.turns.turn(urgent=True):
            await self._shared.forget()


class _SessionState:
    """The connection a session and its views share."""

    def __init__(self, connect: Connect) -> None:
        self.connect = connect
        self.conn: Connection | None = None
        self.turns = Turns()
        self.prepared_max: int | None = None  # None: psycopg's default

    def sever(self) -> None:
        """Cut the open connection (relayer.store.severance); its use ends at once."""
        sever(self.conn)

    async def forget(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            await hang_up(conn)  # the next one opened never shows beside it


class Turns:
    """A lock whose urgent waiters go before the others (each kind first come first served)."""

    def __init__(self) -> None:
        self._busy = False
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._ordinary: deque[asyncio.Future[None]] = deque()

    @asynccontextmanager
    async def turn(
        self, urgent: bool = False, deadline: float | None = None
    ) -> AsyncIterator[None]:
        """The lock for a block; TimeoutError if it did not come by ``deadline`` (the event
        loop's clock; None: no limit)."""
        async with asyncio.timeout_at(deadline):
            await self._acquire(self._urgent if urgent else self._ordinary)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, line: deque[asyncio.Future[None]]) -> None:
        if not self._busy and not self._urgent and not self._ordinary:
            self._busy = True
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        line.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # our turn came as we were cancelled: pass it on
            else:
                line.remove(future)
            raise

    def _release(self) -> None:
        for line in (self._urgent, self._ordinary):
            while line:
                future = line.popleft()
                if not future.done():
                    future.set_result(None)  # the turn passes on: still busy
                    return
        self._busy = False


class Notifications:
    """A LISTEN connection's notifications (see :func:`listen`)."""

    def __init__(self, store: StoreSettings, conn: Connection) -> None:
        self.store = store
        self._conn = conn

    async def next(self, wait: float) -> list[str]:
        """The payloads of what arrived within ``wait`` seconds (at most one; none if nothing
        came). StoreError when the connection is lost."""
        with translated(self.store, "LISTEN"):
            # Bounded waits instead of cancelling a pending read: a cancelled notifies()
            # generator can keep the connection busy at close.
            return [
                notice.payload async for notice in self._conn.notifies(timeout=wait, stop_after=1)
            ]


def can_listen(store: StoreSettings) -> bool:
    """Whether a LISTEN on ``store`` would be kept: on ``listen_dsn``, or on ``dsn`` when no
    transaction pooler is in front of it (there it would silently never fire)."""
    return store.pooler == "none" or bool(store.listen_dsn)


@asynccontextmanager
async def listen(store: StoreSettings) -> AsyncIterator[Notifications]:
    """A connection of its own (on ``listen_dsn`` when set) that LISTENs on ``store``'s
    notify channel for the block."""
    with translated(store, "LISTEN"):
        conn = await connect(store, purpose=f"{store.name}:listen", dsn=store.listen_dsn)
    try:
        with translated(store, "LISTEN"):
            await conn.execute(queries_for(store.names)["listen"])
        yield Notifications(store, conn)
    finally:
        with contextlib.suppress(*DRIVER_ERRORS):  # lost already: nothing left to release
            await conn.close()
