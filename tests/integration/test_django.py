"""Outbox rows in Django's transaction (transaction.atomic, Django on psycopg 3), real PostgreSQL.

Django's settings can be configured once per process: this module points them at a database
of its own (created for the session) and gives each test a fresh store schema in it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from relayer import Outbox, OutboxMessage, lane_for
from relayer.errors import UsageError
from relayer.operations import schema
from relayer.settings import StoreSettings
from tests.conftest import make_store, with_database

django = pytest.importorskip("django", reason="Django comes with the dev extra")
from django.conf import settings  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402

from relayer.django import psycopg_connection  # noqa: E402

_schemas = itertools.count()


@pytest.fixture(scope="module")
def django_dsn(pg_server: str) -> Iterator[str]:
    name = f"relayer_django_{os.getpid()}"
    with psycopg.connect(pg_server, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = with_database(pg_server, name)
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    if not settings.configured:
        settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": info["dbname"],
                    "USER": info.get("user", ""),
                    "PASSWORD": info.get("password", ""),
                    "HOST": info.get("host", ""),
                    "PORT": info.get("port", ""),
                }
            },
            USE_TZ=True,
        )
        django.setup()
    try:
        yield dsn
    finally:
        connections.close_all()
        with psycopg.connect(pg_server, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def store(django_dsn: str) -> Iterator[StoreSettings]:
    store = make_store(django_dsn, lanes=4, schema=f"django_{next(_schemas)}")

    async def apply() -> None:
        async with await psycopg.AsyncConnection.connect(django_dsn, autocommit=True) as conn:
            await schema.apply(conn, store)

    asyncio.run(apply())
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)")
        cursor.execute("TRUNCATE orders")
    yield store
    connections.close_all()


def outbox_bodies(store: StoreSettings) -> list[bytes]:
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute(
            sql.SQL("SELECT body FROM {} ORDER BY id").format(
                sql.Identifier(store.db_schema, f"{store.table_prefix}outbox")
            )
        ).fetchall()
    return [bytes(row[0]) for row in rows]


def orders() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM orders ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


class Listener:
    """LISTEN on the store's channel; ``until_marker`` returns what arrived before a marker
    notification sent now (PostgreSQL delivers notifications in commit order, so a row's
    notification committed earlier arrives first; one not committed never does)."""

    def __init__(self, store: StoreSettings) -> None:
        self.channel = store.names.notify_channel
        self.dsn = store.require_dsn()
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))

    def until_marker(self) -> list[str]:
        with psycopg.connect(self.dsn, autocommit=True) as other:
            other.execute("SELECT pg_notify(%s, 'marker')", (self.channel,))
        arrived: list[str] = []
        for notification in self.conn.notifies(timeout=30):
            if notification.payload == "marker":
                return arrived
            arrived.append(notification.payload)
        raise AssertionError("the marker notification never arrived")

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def listener(store: StoreSettings) -> Iterator[Listener]:
    listening = Listener(store)
    yield listening
    listening.close()


def place(outbox: Outbox, order: str, conn: Any = connection) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO orders (id) VALUES (%s)", [order])
    outbox.write(conn, destination="orders.events", key=order, body=order.encode())


def test_a_row_written_in_atomic_commits_with_the_block_and_notifies_on_commit(
    store: StoreSettings, listener: Listener
) -> None:
    outbox = Outbox(store.model_copy(update={"notify": "in_transaction"}))
    with transaction.atomic():
        place(outbox, "o-1")
        assert outbox_bodies(store) == []  # not visible to others before the commit
        assert listener.until_marker() == []  # and no NOTIFY yet
    assert outbox_bodies(store) == [b"o-1"] and orders() == ["o-1"]
    assert len(listener.until_marker()) == 1  # delivered with the commit


def test_the_default_wakes_the_workers_once_the_block_has_committed(
    store: StoreSettings, listener: Listener
) -> None:
    """notify = "after_commit": the waker sees Django's connection leave its transaction and
    wakes the row's lane from its own connection."""
    assert store.notify == "after_commit"
    outbox = Outbox(store)
    with transaction.atomic():
        place(outbox, "o-6")
        assert outbox_bodies(store) == []
    outbox.flush()  # the waker's next look, done: the block has ended
    # Once, or twice if the block stayed open past the waker's HOLD (woken then, and again at
    # its end).
    assert set(listener.until_marker()) == {str(lane_for("o-6", store.lanes))}


def test_a_rolled_back_block_leaves_neither_the_order_nor_the_row_nor_a_notification(
    store: StoreSettings, listener: Listener
) -> None:
    # The NOTIFY is the transaction's own with notify = "in_transaction"; after_commit's waker
    # cannot tell a rollback from a commit, and its wake-up then costs the workers one probe.
    outbox = Outbox(store.model_copy(update={"notify": "in_transaction"}))
    with pytest.raises(RuntimeError, match="payment declined"), transaction.atomic():
        place(outbox, "o-2", connections["default"])
        raise RuntimeError("payment declined")
    assert outbox_bodies(store) == [] and orders() == []
    assert listener.until_marker() == []


def test_a_nested_block_rolls_back_to_its_savepoint_only(store: StoreSettings) -> None:
    outbox = Outbox(store)
    with transaction.atomic():
        place(outbox, "o-3")
        with pytest.raises(RuntimeError), transaction.atomic():
            place(outbox, "o-4", psycopg_connection())
            raise RuntimeError("inner block fails")
        outbox.write_many(
            connection, [OutboxMessage("orders.events", b"o-5", key="o-5")]
        )  # COPY through Django's connection
    assert outbox_bodies(store) == [b"o-3", b"o-5"] and orders() == ["o-3"]


def test_outside_atomic_the_row_would_commit_alone_and_is_refused(store: StoreSettings) -> None:
    with pytest.raises(UsageError, match=r"outside transaction.atomic\(\)"):
        Outbox(store).write(connection, destination="orders.events", body=b"alone")
    assert outbox_bodies(store) == []


async def test_the_async_writer_says_to_use_the_sync_one(store: StoreSettings) -> None:
    with pytest.raises(UsageError, match="Django's connection is synchronous: use write"):
        await Outbox(store).write_async(connection, destination="orders.events", body=b"x")
