"""Wake-ups after the application's commit (``notify = "after_commit"``, the default).

``Outbox.write`` hands the lanes of its ordered rows to the ``Waker`` of the store's database
(one per process and database, shared by every store there: ``waker_for``) with the
application's psycopg connection they were written on. The waker sends the workers their
notification once that connection's transaction has ended, from relayer's own connection
(relayer.store.notifier), so the application's commit takes no lock for it and keeps its group
commit:

- a connection is looked at every ``WATCH_INTERVAL`` while its rows wait: a synchronous one by
  the waker's thread, which takes the connection's own lock without blocking (a connection in
  use is looked at again later), an asynchronous one on its own event loop. Found outside a
  transaction, it has committed (or rolled back: the workers' probe then finds nothing, which
  costs one probe);
- a connection still in a transaction ``HOLD`` after its rows were written is notified anyway,
  and watched on: it may have committed and begun its next transaction between two looks
  (back-to-back writes on one connection: each ``HOLD`` wakes the rows committed meanwhile), or
  be in a long transaction (it is notified once more when it is seen to end).

The notifications of every connection and store are gathered while one round is being sent:
one statement per round. Nothing here raises into the application or delays it: a failure is
logged (throttled) and the workers' poll (``poll_interval``) delivers the rows, losing nothing.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from relayer.errors import RelayerError
from relayer.observability.throttle import ThrottledLog, shape
from relayer.settings import StoreSettings
from relayer.store.caller import transaction_ended, transaction_ended_async
from relayer.store.notifier import WAKE_QUIET, NotifyConnection, Wake

logger = logging.getLogger(__name__)

# How often a connection whose rows wait is looked at (seconds): the most a wake-up lags the
# application's commit.
WATCH_INTERVAL = 0.001
# How long after its rows were written a connection still in a transaction is notified anyway.
HOLD = 0.01
_NEVER = float("-inf")


@dataclass(slots=True)
class _Waiting:
    """The lanes written through one connection whose transaction has not been seen to end."""

    since: float = 0.0  # when the oldest lane not notified yet was written
    lanes: set[Wake] = field(default_factory=set)  # written, not notified yet
    held: set[Wake] = field(default_factory=set)  # notified while the transaction stayed open

    def add(self, lanes: set[Wake]) -> None:
        if not self.lanes:
            self.since = time.monotonic()
        self.lanes |= lanes

    def next_look(self) -> float:
        """How soon to look again: at once while lanes wait; only now and then once every lane
        is notified and the transaction just stays open (a long one)."""
        return WATCH_INTERVAL if self.lanes else HOLD

    def due(self, ended: bool) -> set[Wake]:
        """The lanes to notify now: every one once the transaction has ended; those written
        HOLD ago or more while it is still open (noted as held, to notify again at its end)."""
        if ended:
            return self.lanes | self.held
        if not self.lanes or time.monotonic() - self.since < HOLD:
            return set()
        lanes, self.lanes = self.lanes, set()
        self.held |= lanes
        return lanes


_WAKERS: dict[tuple[str, str], Waker] = {}
_WAKERS_LOCK = threading.Lock()


def waker_for(store: StoreSettings) -> Waker:
    """The process's waker for ``store``'s database (its DSN and pooler mode), made on first
    use and shared by every store of that database."""
    key = (store.require_dsn(), store.pooler)
    with _WAKERS_LOCK:
        waker = _WAKERS.get(key)
        if waker is None:
            waker = _WAKERS[key] = Waker(store)
        return waker


def _forked() -> None:
    """In a forked child: the wakers' threads did not survive the fork and their connections
    are the parent's (forgotten, not closed); each starts afresh at its next write."""
    for waker in _WAKERS.values():
        waker.forked()


os.register_at_fork(after_in_child=_forked)


class Waker:
    """Wakes the workers of the stores of ``store``'s database after the application's commits
    (see the module docstring)."""

    def __init__(self, store: StoreSettings, notifier: NotifyConnection | None = None) -> None:
        self.store = store
        self.notifier = notifier or NotifyConnection(store)
        self.log = ThrottledLog(logger)
        self._lock = threading.Lock()
        self._wake = _Signal()
        # How long the thread sleeps now (None: until a write): a write wakes it only when it
        # would not look at the connection soon enough by itself (see written).
        self._sleeps: float | None = None
        self._ready: set[Wake] = set()
        # Synchronous connections, by id, with the waiting lanes written through each.
        self._watched: dict[int, tuple[weakref.ref[Any], _Waiting]] = {}
        self._watched_async: weakref.WeakKeyDictionary[Any, _AsyncWatch] = (
            weakref.WeakKeyDictionary()
        )
        self._last_sent: dict[str, float] = {}  # channel -> when it was last notified
        self._flushed: list[threading.Event] = []  # flush() calls waiting for the next round
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._closed = False

    # -- what the writer calls -----------------------------------------------------------

    def written(self, conn: Any, lanes: set[Wake]) -> None:
        """Rows of ``lanes`` (a store's channel and a lane each) were written in ``conn``'s
        transaction (a synchronous psycopg connection): wake their workers once it has
        ended."""
        with self._lock:
            if self._thread is None:  # the first write (after a fork too: see forked)
                self._start()
            watched = self._watched.get(id(conn))
            if watched is None or watched[0]() is not conn:
                watched = self._watched[id(conn)] = (weakref.ref(conn), _Waiting())
            watched[1].add(lanes)
            # The thread is woken only if it would not look soon enough by itself: it sleeps
            # with no end (nothing watched), or longer than WATCH_INTERVAL while one of these
            # stores is not quiet (its wake-up is to go out right after the commit).
            sleeps = self._sleeps
            wake = sleeps is None or (sleeps > WATCH_INTERVAL and not self._quiet(lanes))
            if wake:
                self._sleeps = WATCH_INTERVAL
        if wake:
            self._wake.set()

    def written_async(self, conn: Any, lanes: set[Wake]) -> None:
        """``written`` for an asynchronous psycopg connection: it is looked at on the running
        event loop (where it is used)."""
        watch = self._watched_async.get(conn)
        if watch is None:
            watch = self._watched_async[conn] = _AsyncWatch(self, conn)
        watch.add(lanes)

    def flush(self) -> None:
        """Look at every watched connection now and send the wake-ups of the transactions seen
        to end, before returning (those of transactions still open stay watched)."""
        done = threading.Event()
        with self._lock:
            if self._thread is None or self._pid != os.getpid() or self._closed:
                return
            self._flushed.append(done)
        self._wake.set()
        done.wait()

    def close(self) -> None:
        """Send what waits, the lanes of transactions not seen to end too (a process about to
        exit has committed them, or they are lost anyway), then close the connection. Called
        at the interpreter's exit for a waker that ran."""
        with self._lock:
            self._closed = True
            for _, waiting in self._watched.values():
                self._ready |= waiting.due(True)
            self._watched.clear()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self.notifier.close()

    def forked(self) -> None:
        """In a forked child (see _forked): no thread, the parent's connection forgotten."""
        self._thread = None
        self._watched, self._ready, self._flushed = {}, set(), []
        self._wake, self._sleeps = _Signal(), None
        self.notifier.forget()

    # -- the thread ----------------------------------------------------------------------

    def ended(self, lanes: set[Wake]) -> None:
        """A watched transaction has ended: its lanes go in the next round."""
        with self._lock:
            self._start()
            self._ready |= lanes
        self._wake.set()

    def _start(self) -> None:
        """Start the thread (again after a fork: threads do not survive one). Under _lock."""
        pid = os.getpid()
        if self._thread is not None and self._pid == pid:
            return
        self._pid = pid
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="relayer-waker", daemon=True)
        self._thread.start()
        # A short-lived process (a script, a job) often exits right after its commit: its
        # wake-ups go out first instead of waiting for the workers' poll.
        atexit.register(self.close)

    def _run(self) -> None:
        wait: float | None = None
        while not self._closed or self._ready:
            self._wake.wait(wait)
            lanes, wait, flushed = self._take()
            if lanes:
                self._send(lanes)
            for done in flushed:
                done.set()

    def _take(self) -> tuple[set[Wake], float | None, list[threading.Event]]:
        """The lanes of the transactions seen to end (or held too long), taken; how long to
        wait before looking again (None: until a write); the flushes this round answers."""
        wait: float | None = None
        now = time.monotonic()
        with self._lock:
            for key, (conn, waiting) in list(self._watched.items()):
                quiet = self._quiet_for(waiting, now)
                if quiet > 0:  # nothing to send before then: not looked at (no lock taken)
                    wait = quiet if wait is None else min(wait, quiet)
                    continue
                ended = transaction_ended(conn())
                self._ready |= waiting.due(bool(ended))
                if ended:
                    del self._watched[key]
                else:  # open, or in use right now (None): look again soon
                    soon = WATCH_INTERVAL if ended is None else waiting.next_look()
                    wait = min(wait or HOLD, soon)
            lanes, self._ready = self._ready, set()
            flushed, self._flushed = self._flushed, []
            self._sleeps = wait
        return lanes, wait, flushed

    def _send(self, lanes: set[Wake]) -> None:
        lanes = self._not_quiet(lanes)
        if not lanes:
            return
        try:
            self.notifier.notify(lanes)
        except RelayerError as exc:
            detail = str(exc)
            self.log.warning(
                ("wake_failed", shape(detail)),
                "the workers' wake-up after a commit could not be sent (%s); the rows are sent "
                "at the workers' next poll (their store's poll_interval): check that this "
                "process reaches the database",
                detail,
                extra={"action": "wake_failed", "store": self.store.name},
            )
        self.log.flush_due()

    def quiet(self) -> float:
        """How long the process stays quiet towards a store after notifying it: WAKE_QUIET, or
        0 behind a transaction pooler, whose workers do not poll hot (see Wakeups: a probe
        every 5 ms would hold the pool's few server connections), so every commit is woken."""
        return 0.0 if self.store.pooler == "transaction" else WAKE_QUIET

    def _quiet(self, lanes: set[Wake]) -> bool:
        """Every store of ``lanes`` was notified less than WAKE_QUIET ago."""
        now = time.monotonic()
        last = self._last_sent
        quiet = self.quiet()
        for channel, _ in lanes:  # noqa: SIM110 (all() over a generator costs a write more)
            if now - last.get(channel, _NEVER) >= quiet:
                return False
        return True

    def _quiet_for(self, waiting: _Waiting, now: float) -> float:
        """How long every store of ``waiting``'s lanes stays quiet (0: one is not): until then
        its connection need not be looked at, whatever its transaction does (a write-heavy
        connection is nearly always in a statement, and looking every WATCH_INTERVAL cost a
        thread wake-up a millisecond per writer process)."""
        last = self._last_sent
        channels = {channel for channel, _ in waiting.lanes} or {c for c, _ in waiting.held}
        if not channels:
            return 0.0
        return max(
            0.0, min(last.get(channel, float("-inf")) + self.quiet() - now for channel in channels)
        )

    def _not_quiet(self, lanes: set[Wake]) -> set[Wake]:
        """``lanes`` but those of the stores notified less than WAKE_QUIET ago (their workers
        poll them every HOT_POLL meanwhile); the others are noted as notified now."""
        now = time.monotonic()
        last = self._last_sent
        quiet = {
            channel for channel, _ in lanes if now - last.get(channel, float("-inf")) < self.quiet()
        }
        for channel, _ in lanes:
            if channel not in quiet:
                last[channel] = now
        return {wake for wake in lanes if wake[0] not in quiet}


class _Signal:
    """The thread's wake-up: threading.Event's use here (set, then wait and clear) at a
    fraction of its cost, which the thread pays at every look. A lock held while no wake-up
    is pending: ``set`` releases it, ``wait`` takes it back."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # set already
            self._lock.release()

    def wait(self, timeout: float | None) -> None:
        """Until set (the wake-up is taken) or ``timeout`` seconds (None: no limit)."""
        self._lock.acquire(timeout=-1 if timeout is None else timeout)


class _AsyncWatch:
    """The lanes written through one asynchronous connection, looked at on its event loop."""

    def __init__(self, waker: Waker, conn: Any) -> None:
        self.waker = waker
        self.conn = weakref.ref(conn)
        self.loop = asyncio.get_running_loop()
        self.waiting = _Waiting()
        self.looking = False

    def add(self, lanes: set[Wake]) -> None:
        self.waiting.add(lanes)
        if not self.looking:
            self.looking = True
            self.loop.call_later(WATCH_INTERVAL, self._look)

    def _look(self) -> None:
        ended = transaction_ended_async(self.conn())
        lanes = self.waiting.due(ended)
        if lanes:
            self.waker.ended(lanes)
        if ended:
            self.waiting = _Waiting()
            self.looking = False
        else:
            self.loop.call_later(self.waiting.next_look(), self._look)
