"""Direct dispatch of unordered rows right after the application's transaction commits.

An :class:`UnorderedDispatcher` attaches to an :class:`~relayer.writer.outbox.Outbox`: from then on,
every unordered row the outbox writes is remembered under the connection (or SQLAlchemy
session) it was written through. After the commit, the application asks for them to be sent:

    async with UnorderedDispatcher(outbox) as dispatcher:      # transports from the settings
        async with conn.transaction():
            await outbox.write_async(conn, destination="emails", body=b"...")
        await dispatcher.dispatch_after_commit(conn)

or lets SQLAlchemy do it with ``dispatcher.attach(session_or_sessionmaker)`` (its
``after_commit`` event starts the dispatch, ``after_rollback`` forgets the ids).
:class:`BackgroundDispatcher` is the same for synchronous applications: it runs the dispatcher
on an event loop in a thread of its own.

Nothing here can fail or delay the application's commit: dispatching happens after it, on the
dispatcher's own connections, and never raises for broker or database trouble (it logs and
leaves the rows to the workers' recovery). Only ids whose rows exist are sent, so ids of a
rolled-back transaction that were never forgotten are harmless.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar
from uuid import UUID

from relayer.errors import StoreError, UsageError
from relayer.observability.throttle import ThrottledLog
from relayer.relay.unordered import UnorderedResult, UnorderedSender
from relayer.store import StorePool, unordered_settings
from relayer.store.caller import in_transaction, transaction_owner
from relayer.transports.base import Transport
from relayer.transports.routing import Routing
from relayer.writer.outbox import Outbox

logger = logging.getLogger(__name__)

# Ids kept per connection or session: beyond this, the oldest are left to recovery, so an
# application that never dispatches cannot grow without bound.
MAX_REMEMBERED = 100_000
_T = TypeVar("_T")


class PendingIds:
    """Unordered row ids per transaction owner (connection or session), thread-safe."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._ids: weakref.WeakKeyDictionary[Any, list[UUID]] = weakref.WeakKeyDictionary()

    def add(self, conn: Any, ids: Iterable[UUID]) -> None:
        with self._lock:
            remembered = self._ids.setdefault(transaction_owner(conn), [])
            remembered.extend(ids)
            if len(remembered) > self.limit:
                del remembered[: len(remembered) - self.limit]

    def take(self, conn: Any) -> list[UUID]:
        with self._lock:
            return self._ids.pop(transaction_owner(conn), [])

    def forget(self, conn: Any) -> int:
        return len(self.take(conn))

    def __len__(self) -> int:
        with self._lock:
            return sum(len(ids) for ids in self._ids.values())


class UnorderedDispatcher:
    """Sends the unordered rows of ``outbox`` after commit (see the module docstring).

    ``transports`` default to the store's configured ones, started by ``start`` and closed by
    ``close``. Transports passed in are the caller's: already started, never closed here
    (unless ``owns_transports``). ``max_connections`` bounds the dispatcher's own pool.
    """

    def __init__(
        self,
        outbox: Outbox,
        transports: Mapping[str, Transport] | None = None,
        *,
        max_connections: int = 4,
        owns_transports: bool | None = None,
    ) -> None:
        if outbox.on_unordered is not None:
            raise UsageError("this Outbox already has an after-commit dispatcher attached")
        self.outbox = outbox
        self.store = outbox.store
        self.pending = PendingIds()
        self._given = dict(transports) if transports is not None else None
        self._owns = transports is None if owns_transports is None else owns_transports
        self._max_connections = max_connections
        self._sender: UnorderedSender | None = None
        self._pool: StorePool | None = None
        self._tasks: set[asyncio.Task[UnorderedResult]] = set()
        self._listeners: list[tuple[Any, str, Callable[..., None]]] = []
        # Rows this dispatcher sent and failed attempts, since it was made (for your metrics).
        self.sent = 0
        self.failed = 0
        # While the database is down every commit's dispatch fails alike: one line per cause.
        self._log = ThrottledLog(logger)
        outbox.on_unordered = self.pending.add

    def __repr__(self) -> str:
        return f"UnorderedDispatcher(store={self.store.name!r}, pending={len(self.pending)})"

    async def __aenter__(self) -> UnorderedDispatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the transports it owns and open its connection pool. Errors propagate, after
        closing what was already started."""
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        transports = self._given
        if transports is None:
            from relayer.transports.registry import create_transports

            transports = create_transports(self.store)
        self._sender = UnorderedSender(self.store, Routing(self.store, transports))
        if self._owns:
            for transport in transports.values():
                await transport.start()
        pool = StorePool(
            self.store,
            purpose="after",
            max_size=self._max_connections,
            settings=unordered_settings(self.store),
        )
        self._pool = pool
        await pool.open(within=30)

    async def close(self) -> None:
        """Finish the dispatches in flight, then close the pool and owned transports."""
        if self._listeners:
            from sqlalchemy import event

            for target, name, listener in self._listeners:
                event.remove(target, name, listener)
            self._listeners.clear()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self._owns and self._sender is not None:
            for transport in self._sender.routing.transports.values():
                try:
                    await transport.close()
                except Exception as exc:  # closing must go on with the other transports
                    logger.warning("closing transport %s failed: %s", transport.name, exc)
        self._sender = None
        self.outbox.on_unordered = None

    async def dispatch_after_commit(self, conn: Any) -> UnorderedResult:
        """Send the unordered rows written through ``conn`` since its last dispatch; call it
        right after the commit. Rows that fail or cannot be sent stay for recovery."""
        _require_finished(conn)
        return await self.dispatch(self.pending.take(conn))

    def forget(self, conn: Any) -> int:
        """Drop the ids remembered for ``conn`` (after a rollback); returns how many."""
        return self.pending.forget(conn)

    async def dispatch(self, ids: Iterable[UUID]) -> UnorderedResult:
        """Send these unordered rows, in batches of ``batch_size``, each in one transaction."""
        ids = list(ids)
        if not ids:
            return UnorderedResult()
        if self._sender is None or self._pool is None:
            raise UsageError("the dispatcher is not started; use `async with` or await start()")
        total = UnorderedResult()
        size = self.store.batch_size
        for start in range(0, len(ids), size):
            try:
                async with self._pool.connection(
                    "get a dispatch connection", wait=self._sender.deadline
                ) as conn:
                    result = await self._sender.send_ids(conn, ids[start : start + size])
                total += result
                self.sent += result.sent
                self.failed += result.failed
            except StoreError as exc:
                detail = str(exc)
                self._log.warning(
                    ("unordered_unavailable",),
                    "store %s: cannot dispatch %s unordered rows after commit (%s); the workers "
                    "recover them after unordered_grace",
                    self.store.name,
                    len(ids) - start,
                    detail,
                    extra={"action": "unordered_unavailable", "store": self.store.name},
                )
                return total + UnorderedResult(error=detail)
        return total

    def attach(self, target: Any) -> None:
        """Dispatch after every commit of an SQLAlchemy session: ``target`` is a Session, a
        sessionmaker, a Session subclass or an AsyncSession. Call it on the dispatcher's loop."""
        loop = asyncio.get_running_loop()

        def committed(session: Any) -> None:
            ids = self.pending.take(session)
            if ids:
                loop.call_soon_threadsafe(self._spawn, ids)

        self._listeners.extend(listen_sessions(target, committed, self.pending.forget))

    def _spawn(self, ids: list[UUID]) -> None:
        task = asyncio.ensure_future(self.dispatch(ids))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[UnorderedResult]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("after-commit dispatch failed", exc_info=task.exception())


class BackgroundDispatcher:
    """An UnorderedDispatcher for synchronous applications, on an event loop in its own thread.

    Transports given here are started and closed by it, on that thread (they belong to its loop).
    """

    def __init__(
        self,
        outbox: Outbox,
        transports: Mapping[str, Transport] | None = None,
        *,
        max_connections: int = 4,
    ) -> None:
        self.dispatcher = UnorderedDispatcher(
            outbox, transports, max_connections=max_connections, owns_transports=True
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> BackgroundDispatcher:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self, timeout: float = 60) -> None:
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=loop.run_forever, name=f"relayer-after-commit-{self.dispatcher.store.name}"
        )
        self._thread.daemon = True
        self._thread.start()
        self._loop = loop
        try:
            self._run(self.dispatcher.start(), timeout)
        except BaseException:
            self._stop_loop()
            raise

    def close(self, timeout: float | None = None) -> None:
        """Finish the dispatches in flight, close everything and stop the thread."""
        if self._loop is None:
            return
        try:
            self._run(self.dispatcher.close(), timeout)
        finally:
            self._stop_loop()

    def dispatch_after_commit(self, conn: Any, *, wait: bool = True) -> UnorderedResult | None:
        """Send what ``conn`` wrote; with ``wait=False`` return at once (the send goes on)."""
        _require_finished(conn)
        ids = self.dispatcher.pending.take(conn)
        if not wait:
            self._submit(ids)
            return None
        return self._run(self.dispatcher.dispatch(ids), None)

    def forget(self, conn: Any) -> int:
        return self.dispatcher.forget(conn)

    def attach(self, target: Any) -> None:
        """Like UnorderedDispatcher.attach; the commit returns without waiting for the send."""

        def committed(session: Any) -> None:
            self._submit(self.dispatcher.pending.take(session))

        listeners = listen_sessions(target, committed, self.dispatcher.pending.forget)
        self.dispatcher._listeners.extend(listeners)

    def _submit(self, ids: list[UUID]) -> None:
        if ids and self._loop is not None:
            self._loop.call_soon_threadsafe(self.dispatcher._spawn, ids)

    def _run(self, coroutine: Coroutine[Any, Any, _T], timeout: float | None) -> _T:
        if self._loop is None:
            coroutine.close()
            raise UsageError("the dispatcher is not started; use `with` or call start()")
        future: Future[_T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout)

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def listen_sessions(
    target: Any, committed: Callable[[Any], None], rolled_back: Callable[[Any], Any]
) -> list[tuple[Any, str, Callable[..., None]]]:
    """Register SQLAlchemy ``after_commit``/``after_rollback`` listeners on ``target``."""
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    if isinstance(target, AsyncSession):
        target = target.sync_session
    elif isinstance(target, async_sessionmaker):
        raise UsageError(
            "attach each AsyncSession, or an async_sessionmaker's sync_session_class (a Session "
            "subclass of your own, so that the events do not apply to every Session)"
        )

    def after_commit(session: Any) -> None:
        committed(session)

    def after_rollback(session: Any) -> None:
        rolled_back(session)

    listeners = [(target, "after_commit", after_commit), (target, "after_rollback", after_rollback)]
    for registered in listeners:
        event.listen(*registered)
    return listeners


def _require_finished(conn: Any) -> None:
    if in_transaction(conn):
        raise UsageError(
            "dispatch_after_commit(conn) was called while conn's transaction is still open; "
            "call it after conn.commit() (or after the `with conn.transaction():` block)"
        )
