"""One LISTEN connection for every store of a database that a worker serves.

Writers NOTIFY their store's channel (``<schema>.<prefix>outbox``, hashed past 63 bytes) with
the lane they wrote, or an empty payload for every lane. The stores of one database share one
connection (on ``listen_dsn`` when set), which LISTENs on each store's channel and hands each
notification to the store of its channel. Stores join and leave while it runs: the connection
LISTENs or UNLISTENs between two waits (LISTEN_WAIT), and a store's ``listening`` callback runs
once its LISTEN is in place (the store then probes for what was written before). If the
connection is lost, it reconnects after ``retry_backoff``; meanwhile the stores' polls every
``poll_interval`` find their rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from relayer.errors import StoreError
from relayer.observability.throttle import ThrottledLog, shape
from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.store.driver import DRIVER_ERRORS, Connection, connect, hang_up, store_error
from relayer.store.severance import Guard

logger = logging.getLogger(__name__)

# How long the LISTEN connection waits for notifications before it looks for stores that
# joined or left (and for the end).
LISTEN_WAIT = 0.5
# At most this many store names in a log line (the rest are counted).
NAMED_STORES = 5


@dataclass(frozen=True, slots=True)
class Subscriber:
    store: StoreSettings
    woken: Callable[[str], None]  # a notification's payload (a lane, or '' for every lane)
    listening: Callable[[], None]  # its LISTEN is in place (again): look for what was missed


class SharedListener:
    """The LISTEN connection of one database (``store`` says where: its ``listen_dsn``, else
    its ``dsn``), shared by the stores that subscribe; runs while any is subscribed."""

    def __init__(
        self,
        store: StoreSettings,
        *,
        label: str,
        name: Callable[[], str] = lambda: "listen",
        guard: Guard | None = None,
    ) -> None:
        """``guard`` opens the connection on the listener's behalf (given how, and what for):
        the database's relayer.store.severance.Severance in a worker."""
        self.store = store
        self._guard = guard
        self.label = label
        self.name = name  # of the connection (application_name relayer:NAME), when made
        self.log = ThrottledLog(logger)
        self._subscribers: dict[str, Subscriber] = {}
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()  # set when the last store left

    @property
    def channels(self) -> list[str]:
        return list(self._subscribers)

    def subscribe(
        self,
        store: StoreSettings,
        woken: Callable[[str], None],
        listening: Callable[[], None],
    ) -> None:
        self._subscribers[store.names.notify_channel] = Subscriber(store, woken, listening)
        if self._task is None or self._task.done():
            self._idle.clear()
            self._task = asyncio.ensure_future(self._run())

    async def unsubscribe(self, store: StoreSettings) -> None:
        """``store`` gets no more notifications; the last store out closes the connection."""
        self._subscribers.pop(store.names.notify_channel, None)
        if self._subscribers or self._task is None:
            return
        self._idle.set()
        task, self._task = self._task, None
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        while self._subscribers:
            try:
                await self._listen()
            except StoreError as exc:
                self._lost(exc)
            except DRIVER_ERRORS as exc:
                self._lost(store_error(self.store, "LISTEN", exc))
            else:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), self._retry())

    async def _listen(self) -> None:
        purpose = self.name()

        def make() -> Awaitable[Connection]:
            return connect(self.store, purpose=purpose, dsn=self.store.listen_dsn)

        conn = await (make() if self._guard is None else self._guard(make, "LISTEN (connecting)"))
        try:
            await self._serve(conn)
        finally:
            await hang_up(conn)

    async def _serve(self, conn: Connection) -> None:
        listening: dict[str, StoreSettings] = {}
        # Notifications that arrive while a LISTEN or UNLISTEN runs come through psycopg.
        conn.add_notify_handler(lambda notice: self._deliver(notice.channel, notice.payload))
        while self._subscribers:
            for channel in [channel for channel in listening if channel not in self._subscribers]:
                await conn.execute(queries_for(listening.pop(channel).names)["unlisten"])
            joined = [sub for ch, sub in self._subscribers.items() if ch not in listening]
            for subscriber in joined:
                await conn.execute(queries_for(subscriber.store.names)["listen"])
                listening[subscriber.store.names.notify_channel] = subscriber.store
            for subscriber in joined:
                subscriber.listening()
            await receive(conn, LISTEN_WAIT, self._deliver)

    def _deliver(self, channel: str, payload: str) -> None:
        to = self._subscribers.get(channel)
        if to is not None:
            to.woken(payload)

    def _retry(self) -> float:
        backoffs = [sub.store.retry_backoff.total_seconds() for sub in self._subscribers.values()]
        return min(backoffs, default=1.0)

    def _lost(self, exc: StoreError) -> None:
        stores = [sub.store.name for sub in self._subscribers.values()]
        named = ", ".join(stores[:NAMED_STORES])
        if len(stores) > NAMED_STORES:
            named += f" and {len(stores) - NAMED_STORES} more"
        self.log.warning(
            ("listen_lost", shape(str(exc))),
            "LISTEN on %s %s lost: %s; polling every poll_interval until it is back (retrying "
            "in %.1f s)",
            "store" if len(stores) == 1 else "stores",
            named,
            exc,
            self._retry(),
            extra={"action": "listen_lost", "store": stores[0] if stores else ""},
        )


async def receive(conn: Connection, seconds: float, deliver: Callable[[str, str], None]) -> None:
    """Hand every notification that reaches ``conn`` within ``seconds`` to ``deliver``
    (channel, payload); raises the driver's error if the connection is lost.

    A reader on the connection's socket drains libpq's queue whenever bytes arrive. psycopg's
    ``notifies()`` sets a wait up and tears it down (a reader, a timer, a future) for each
    arrival: at a steady 1,000 notifications a second that cost the event loop 137-147 µs of
    CPU a notification, against 48 this way (the two alternated). The wait is bounded instead of
    cancelled, and the connection's lock is held throughout, so no statement of psycopg's
    reads the socket meanwhile.
    """
    pgconn = conn.pgconn
    encoding = conn.info.encoding
    loop = asyncio.get_running_loop()
    lost: asyncio.Future[None] = loop.create_future()
    socket = pgconn.socket

    def readable() -> None:
        try:
            pgconn.consume_input()
        except DRIVER_ERRORS as exc:
            loop.remove_reader(socket)
            if not lost.done():
                lost.set_exception(exc)
            return
        while (notice := pgconn.notifies()) is not None:
            deliver(notice.relname.decode(encoding), notice.extra.decode(encoding))

    async with conn.lock:
        try:
            readable()  # what the last statement's reply left in libpq's buffer comes first
            if not lost.done():
                # Raises OSError for a socket closed meanwhile (the server ended the session).
                loop.add_reader(socket, readable)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(seconds):
                        await lost
        finally:
            loop.remove_reader(socket)
            # Lost at once, just as the bound ran out, or with the task cancelled: the error is
            # taken here, so that it is raised below instead of being reported as never
            # retrieved.
            error = lost.exception() if lost.done() and not lost.cancelled() else None
    if error is not None:
        raise error
