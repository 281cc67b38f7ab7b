"""The notifications that wake the workers after the application's commit, sent on a connection
of relayer's own in the application's process (relayer.writer.waker): one per database, for
every store of that database the process writes to (the notification's channel names the store).

A NOTIFY inside the application's transaction makes its commit take a database-wide lock and
hold it through the commit record's flush: notifying commits are serialized and lose group
commit. Sent from this connection instead, after the application's commit, the lock is taken by
this connection's tiny transactions only, which do not wait for the WAL flush either
(``synchronous_commit = off``: a notification lost in a server crash only delays rows until the
workers' next poll; it loses nothing).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import psycopg

from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.store.connections import local_settings
from relayer.store.driver import connection_kwargs, translated
from relayer.store.outbox import NOTIFY_LANES_MAX

# The waker's transactions: nothing in them is worth waiting for the WAL flush.
WAKE_SETTINGS = {"synchronous_commit": "off"}


# After notifying a store, a writer's process stays quiet for that store this long (seconds):
# the workers, once woken, poll the store's lanes every HOT_POLL until HOT_HOLD has passed
# since the last notification they heard, so they find the rows committed in the quiet time
# too. At a steady rate a process then sends a store a few notifications a second, not one a
# commit (each is a transaction of its own on the application's database).
WAKE_QUIET = 0.25
HOT_POLL = 0.005
HOT_HOLD = 4 * WAKE_QUIET

# A wake-up: a store's notification channel and one of its lanes, or EVERY_LANE.
Wake = tuple[str, int]
EVERY_LANE = -1


class NotifyConnection:
    """A synchronous connection to ``store``'s database that sends wake-ups for any store of
    that database (opened on first use, and again after any failure)."""

    def __init__(self, store: StoreSettings, *, purpose: str = "waker") -> None:
        self.store = store
        self.purpose = purpose
        queries = queries_for(store.names)
        self._notify_channels = queries["notify_channels"]
        self._set_local = queries["set_local"]
        # Behind a transaction pooler start-up options are refused: SET LOCAL in each one.
        self._local = local_settings(store, WAKE_SETTINGS)
        self._conn: psycopg.Connection[Any] | None = None
        self.sent = 0  # notifying transactions committed (tests and diagnostics)

    def notify(self, wakes: Collection[Wake]) -> None:
        """Send ``wakes`` in one statement, one transaction: a notification per lane, a single
        empty one (every lane) for a channel with more than NOTIFY_LANES_MAX. StoreError for
        database trouble: the connection is dropped and the next call reconnects."""
        with translated(self.store, "wake the workers"):
            try:
                self._send(self._connection(), payloads(wakes))
            except BaseException:
                self.close()
                raise
        self.sent += 1

    def _send(self, conn: psycopg.Connection[Any], sent: tuple[list[str], list[str]]) -> None:
        if self._local is None:  # autocommit, the settings given at connect
            conn.execute(self._notify_channels, sent, prepare=False)
            return
        with conn.transaction():
            conn.execute(self._set_local, self._local, prepare=False)
            conn.execute(self._notify_channels, sent, prepare=False)

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        store = self.store
        # Shared by the database's stores: named after its purpose only (relayer:waker).
        kwargs = connection_kwargs(store, autocommit=True, name=self.purpose)
        if self._local is None:
            kwargs["options"] = " ".join(
                f"-c {name}={value}" for name, value in WAKE_SETTINGS.items()
            )
        self._conn = psycopg.Connection.connect(store.require_dsn(), **kwargs)
        return self._conn

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            conn.close()

    def forget(self) -> None:
        """Drop the connection without closing it: in a forked child, whose parent still uses
        the socket (a close would hang up the parent's session)."""
        self._conn = None


def payloads(wakes: Collection[Wake]) -> tuple[list[str], list[str]]:
    """``wakes`` as the channels and payloads of notify_channels: a lane's number, or one empty
    payload (every lane) for a channel woken in more than NOTIFY_LANES_MAX lanes or in
    EVERY_LANE; sorted, so that lanes are notified in order."""
    by_channel: dict[str, set[int]] = {}
    for channel, lane in wakes:
        by_channel.setdefault(channel, set()).add(lane)
    channels: list[str] = []
    texts: list[str] = []
    for channel, lanes in sorted(by_channel.items()):
        if EVERY_LANE in lanes or len(lanes) > NOTIFY_LANES_MAX:
            channels.append(channel)
            texts.append("")
            continue
        for lane in sorted(lanes):
            channels.append(channel)
            texts.append(str(lane))
    return channels, texts
