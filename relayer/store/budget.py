"""The connection budget of a worker process: at most ``worker.max_connections`` connections
open at once, shared by every database the worker serves.

A database holds a few *fixed* connections while any of its stores is served (housekeeping,
LISTEN, dispatcher: each reserves a unit of the budget, connected or not) and *batch*
connections on demand from its :class:`BatchPool`. Every pool draws on the one budget:

- a pool reuses its own idle connections first, the most recently returned first, so the
  others age out: a connection idle for ``max_idle`` seconds is closed (an idle database ends
  up holding none);
- with no idle connection it opens one if the budget has a unit free; if not, it closes
  another database's idle connection to open its own; if none is idle it waits, first come
  first served, for a connection to be returned (one returned while the oldest waiter wants
  another database is closed, and its unit handed over);
- a reservation (a database whose stores join a running worker) goes before every batch.

psycopg_pool counts each pool's connections on its own, and a pool made smaller closes
nothing, so a bound across pools is kept here. A unit is taken before a connection is opened
and given back once the server has hung up on the closed connection (relayer.store.driver.
hang_up: its process has left pg_stat_activity by then), so the connections counted there
never exceed the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from relayer.errors import ConnectionsBusy
from relayer.settings import StoreSettings
from relayer.store.driver import (
    DRIVER_ERRORS,
    Connection,
    connection_kwargs,
    hang_up,
    is_broken,
    store_error,
)
from relayer.store.severance import Guard

logger = logging.getLogger(__name__)

# A batch connection is closed when returned this long after it was opened (as psycopg_pool
# does after an hour), so server-side memory a long-lived backend accumulates is given back.
MAX_LIFETIME = 3600.0
# What BatchPool.available reports for a budget without a limit.
UNLIMITED = 1 << 30


class ConnectionBudget:
    """The units of one worker's connections: ``limit`` at most (None: no limit), each held by
    a fixed connection's reservation or by an open batch connection."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.reserved = 0
        self.batch = 0
        self.highest = 0  # the most units ever held at once
        self._pools: list[BatchPool] = []
        self._reservations: deque[asyncio.Future[None]] = deque()
        self._waiters: deque[_Waiter] = deque()

    def __repr__(self) -> str:
        return f"ConnectionBudget(limit={self.limit}, reserved={self.reserved}, batch={self.batch})"

    def set_limit(self, limit: int | None) -> None:
        """A new limit (stores joined or left a worker whose limit is computed): waiters get
        the room it adds; one below what is held takes effect as connections close."""
        self.limit = limit
        self._grant()

    @property
    def used(self) -> int:
        return self.reserved + self.batch

    def _room(self) -> bool:
        return self.limit is None or self.used < self.limit

    def _held(self, reserved: int = 0, batch: int = 0) -> None:
        self.reserved += reserved
        self.batch += batch
        self.highest = max(self.highest, self.used)

    async def reserve(self) -> None:
        """Hold a unit for a fixed connection until :meth:`unreserve`: at once while the budget
        has room, else by closing an idle batch connection, else once one is returned."""
        if self._room():
            self._held(reserved=1)
            return
        idle = self._take_idle(None)
        if idle is not None:
            pool, conn = idle
            await pool.discard(conn, hand_over=False)
            self._held(reserved=1, batch=-1)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reservations.append(future)
        try:
            await future  # granted by _grant, which counts the unit as reserved
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.unreserve()
            else:
                self._reservations.remove(future)
            raise

    def unreserve(self) -> None:
        self._held(reserved=-1)
        self._grant()

    def _freed(self) -> None:
        """A batch connection was closed: its unit goes to the first in line."""
        self._held(batch=-1)
        self._grant()

    def _grant(self) -> None:
        while self._room() and (self._reservations or self._waiters):
            if self._reservations:
                future = self._reservations.popleft()
                if not future.done():
                    self._held(reserved=1)
                    future.set_result(None)
                continue
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                self._held(batch=1)
                waiter.future.set_result(None)  # a unit: the waiter opens its connection

    def _returned(self, pool: BatchPool, conn: Connection) -> bool:
        """Where a connection ``pool`` got back goes: to its first waiter if that one wants
        this pool (True), else it is to be closed (False, a reservation or a waiter of another
        pool gets its unit) or kept idle (True). False changes nothing: asking again gives the
        same answer."""
        while self._waiters and self._waiters[0].future.done():
            self._waiters.popleft()  # gave up waiting
        if self._reservations:
            return False
        if self._waiters:
            if self._waiters[0].pool is not pool:
                return False
            self._waiters.popleft().future.set_result(conn)
            return True
        pool.keep_idle(conn)
        return True

    def _take_idle(self, besides: BatchPool | None) -> tuple[BatchPool, Connection] | None:
        """The idle connection unused longest in any pool but ``besides``, taken out of it."""
        pools = [pool for pool in self._pools if pool is not besides and pool.idle]
        if not pools:
            return None
        pool = min(pools, key=lambda pool: pool.idle_since())
        return pool, pool.take_oldest()

    def _register(self, pool: BatchPool) -> None:
        if pool not in self._pools:
            self._pools.append(pool)


@dataclass(slots=True)
class _Waiter:
    pool: BatchPool
    # Resolved with a connection handed over by its pool, or None: a unit to open one with.
    future: asyncio.Future[Connection | None]


@dataclass(slots=True)
class _Idle:
    conn: Connection
    since: float


class BatchPool:
    """Transaction connections (autocommit off) to one database, shared by its stores and
    drawing on a :class:`ConnectionBudget`. ``settings`` are server settings given at connect
    as start-up options (not behind a transaction pooler, which refuses them: there each
    transaction sets its own, see relayer.store.connections.local_settings).

    ``connection()`` waits at most ``wait`` seconds (default ``timeout``) for the budget, then
    raises ConnectionsBusy; a connection it opens must be made within ``timeout``.
    """

    def __init__(
        self,
        budget: ConnectionBudget,
        store: StoreSettings,
        *,
        name: str | Callable[[], str],
        settings: Mapping[str, str] | None = None,
        max_idle: float = 60.0,
        timeout: float = 30.0,
        guard: Guard | None = None,
    ) -> None:
        self.budget = budget
        self._guard = guard
        self.store = store  # the connection's target (dsn, pooler); errors name the caller's
        self.max_idle = max_idle
        self.timeout = timeout
        # The name of a connection (application_name relayer:NAME), when it is made.
        self.name: Callable[[], str] = name if callable(name) else lambda: name
        self._options = ""
        if settings and store.pooler == "none":
            self._options = " ".join(f"-c {key}={value}" for key, value in settings.items())
        self.idle: list[_Idle] = []  # oldest first: connections are reused from the end
        self.opened = 0  # connections of this pool, in use, idle or being opened
        self.closed = False
        self._reaper: asyncio.Task[None] | None = None
        self._created: dict[int, float] = {}

    def __repr__(self) -> str:
        return f"BatchPool(opened={self.opened}, idle={len(self.idle)}, closed={self.closed})"

    def for_store(self, store: StoreSettings) -> StoreConnections:
        """This pool as ``store`` uses it: its errors name ``store``."""
        return StoreConnections(self, store)

    def open(self) -> None:
        self.closed = False
        self.budget._register(self)

    @asynccontextmanager
    async def connection(
        self, doing: str = "", *, wait: float | None = None, store: StoreSettings | None = None
    ) -> AsyncIterator[Connection]:
        """A connection for one transaction (rolled back if left open), returned at the end;
        StoreError for a driver error in the block, ConnectionsBusy if none came in time."""
        store = store or self.store
        doing = doing or "a batch connection"
        conn = await self._get(store, doing, self.timeout if wait is None else wait)
        try:
            yield conn
        except DRIVER_ERRORS as exc:
            raise store_error(store, doing, exc) from exc
        finally:
            # The usual case (committed, nothing to roll back, kept or handed to a waiter) is
            # settled at once: no task for a shield, no turn of the event loop. Otherwise
            # shielded: a cancelled batch must not lose the connection or its unit.
            if not (self._reusable(conn) and self.budget._returned(self, conn)):
                await asyncio.shield(self._put(conn))

    def available(self) -> int:
        """How many transactions could have a connection now without waiting: this pool's
        idle connections, plus the budget's free units unless someone waits for one (without
        a limit, as many as anyone asks)."""
        budget = self.budget
        if self.closed:
            return 0
        if budget._waiters or budget._reservations:
            return len(self.idle)
        if budget.limit is None:
            return UNLIMITED
        return len(self.idle) + max(budget.limit - budget.used, 0)

    async def _get(self, store: StoreSettings, doing: str, wait: float) -> Connection:
        if self.closed:
            raise ConnectionsBusy(f"store {store.name!r}: {doing}: the worker is not serving it")
        while self.idle:
            conn = self.idle.pop().conn
            if not is_broken(conn):
                return conn
            await self.discard(conn)
        budget = self.budget
        if not budget._waiters and not budget._reservations and budget._room():
            budget._held(batch=1)
            return await self._connect(store, doing)
        if not budget._waiters and not budget._reservations:
            idle = budget._take_idle(self)
            if idle is not None:  # its unit is ours: close that connection, open one here
                pool, old = idle
                await pool.discard(old, hand_over=False)
                return await self._connect(store, doing)
        return await self._wait(store, doing, wait)

    async def _wait(self, store: StoreSettings, doing: str, wait: float) -> Connection:
        future: asyncio.Future[Connection | None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(self, future)
        self.budget._waiters.append(waiter)
        try:
            async with asyncio.timeout(wait):
                got = await future
        except BaseException as exc:
            if future.done() and not future.cancelled():
                got = future.result()  # granted as the wait ended
                if isinstance(exc, TimeoutError):
                    return got if got is not None else await self._connect(store, doing)
                if got is None:
                    self.budget._freed()
                else:
                    await self._put(got)
            else:
                with contextlib.suppress(ValueError):
                    self.budget._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise ConnectionsBusy(
                    f"store {store.name!r}: {doing}: every connection the worker may open "
                    f"(worker.max_connections = {self.budget.limit}) stayed in use for "
                    f"{wait:g} s"
                ) from None
            raise
        if got is None:
            return await self._connect(store, doing)
        return got

    async def _connect(self, store: StoreSettings, doing: str) -> Connection:
        """A new connection, its unit already taken (given back if connecting fails)."""
        self.opened += 1
        try:
            kwargs = connection_kwargs(self.store, autocommit=False, name=self.name())
            if self._options:
                kwargs["options"] = self._options
            async with asyncio.timeout(self.timeout):
                conn = await self._open(kwargs, doing)
        except BaseException as exc:
            self.opened -= 1
            self.budget._freed()
            if isinstance(exc, (*DRIVER_ERRORS, TimeoutError)):
                raise store_error(store, f"{doing} (connecting)", exc) from exc
            raise
        self._created[id(conn)] = time.monotonic()
        return conn

    async def _open(self, kwargs: dict[str, Any], doing: str) -> Connection:
        def make() -> Awaitable[Connection]:
            return psycopg.AsyncConnection.connect(self.store.require_dsn(), **kwargs)

        if self._guard is None:
            return await make()
        return await self._guard(make, f"{doing} (connecting)")

    async def _put(self, conn: Connection) -> None:
        if self.closed or is_broken(conn) or self._expired(conn):
            await self.discard(conn)
            return
        status = conn.info.transaction_status
        if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
            try:
                await conn.rollback()
            except DRIVER_ERRORS:
                await self.discard(conn)
                return
        elif status != TransactionStatus.IDLE:  # returned mid-statement: not reusable
            await self.discard(conn)
            return
        if not self.budget._returned(self, conn):
            await self.discard(conn)

    def _reusable(self, conn: Connection) -> bool:
        """``conn`` can go back as it is: the pool is open, the connection is sound, not past
        its lifetime and not in a transaction (what ``_put`` would otherwise settle)."""
        return (
            not self.closed
            and not is_broken(conn)
            and not self._expired(conn)
            and conn.info.transaction_status == TransactionStatus.IDLE
        )

    def _expired(self, conn: Connection) -> bool:
        return time.monotonic() - self._created.get(id(conn), 0.0) > MAX_LIFETIME

    def keep_idle(self, conn: Connection) -> None:
        self.idle.append(_Idle(conn, time.monotonic()))
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap())

    def idle_since(self) -> float:
        return self.idle[0].since

    def take_oldest(self) -> Connection:
        return self.idle.pop(0).conn

    async def discard(self, conn: Connection, *, hand_over: bool = True) -> None:
        """Close ``conn`` (one of this pool's); its unit goes back to the budget, or, with
        ``hand_over`` False, stays with the caller, who took it over."""
        self._created.pop(id(conn), None)
        await hang_up(conn)  # until its server process is gone: the unit is free then
        self.opened -= 1
        if hand_over:
            self.budget._freed()

    async def _reap(self) -> None:
        """Close connections idle for ``max_idle`` (the oldest first), until none is idle."""
        while self.idle and not self.closed:
            left = self.idle[0].since + self.max_idle - time.monotonic()
            if left > 0:
                await asyncio.sleep(left)
                continue
            await self.discard(self.take_oldest())

    async def close(self) -> None:
        """Close the idle connections, and the others once returned (the last store of the
        database left); ``open`` makes it usable again."""
        self.closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        while self.idle:
            await self.discard(self.idle.pop().conn)


class StoreConnections:
    """A database's :class:`BatchPool` as one store uses it (errors name the store)."""

    def __init__(self, pool: BatchPool, store: StoreSettings) -> None:
        self.pool = pool
        self.store = store

    def connection(
        self, doing: str = "", *, wait: float | None = None
    ) -> contextlib.AbstractAsyncContextManager[Connection]:
        return self.pool.connection(doing, wait=wait, store=self.store)

    def available(self) -> int:
        return self.pool.available()
