import asyncio
import select
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from relayer import Outbox, OutboxMessage, lane_for
from relayer.errors import (
    InvalidMessageError,
    LaneCountMismatchError,
    SchemaNotAppliedError,
    UsageError,
)
from relayer.settings import StoreSettings
from tests.conftest import apply_schema, make_store


def outbox_rows(dsn: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT id, lane, ordering_key, transport, destination, body, headers, deliver_at "
            "FROM orders_outbox ORDER BY id"
        ).fetchall()


def sqlalchemy_url(dsn: str) -> str:
    return dsn.replace("postgresql://", "postgresql+psycopg://", 1)


@pytest.fixture
def business_table(store: StoreSettings) -> Iterator[None]:
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer text)")
    yield


def test_commit_makes_the_row_visible_with_every_field(store: StoreSettings) -> None:
    outbox = Outbox(store)
    due = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    with psycopg.connect(store.require_dsn()) as conn:
        message_id = outbox.write(
            conn,
            destination="orders.events",
            body=b"\x00\x01payload",
            key="customer-7",
            headers={"event-type": "OrderPlaced"},
            transport="kafka",
            deliver_at=due,
        )
        conn.commit()
    [row] = outbox_rows(store.require_dsn())
    assert row == (
        message_id,
        lane_for("customer-7", store.lanes),
        "customer-7",
        "kafka",
        "orders.events",
        b"\x00\x01payload",
        {"event-type": "OrderPlaced"},
        due,
    )
    assert message_id.version == 7


def test_rollback_leaves_no_row(store: StoreSettings, business_table: None) -> None:
    outbox = Outbox(store)
    with psycopg.connect(store.require_dsn()) as conn:
        conn.execute("INSERT INTO orders VALUES (1, 'c')")
        outbox.write(conn, destination="d", body=b"x", key="c")
        conn.rollback()
    assert outbox_rows(store.require_dsn()) == []


def test_write_joins_the_callers_transaction(store: StoreSettings, business_table: None) -> None:
    outbox = Outbox(store)
    dsn = store.require_dsn()
    with psycopg.connect(dsn) as conn, psycopg.connect(dsn) as observer:
        conn.execute("INSERT INTO orders VALUES (1, 'c')")
        outbox.write(conn, destination="d", body=b"x", key="c")
        # Not committed: another session sees neither the business row nor the outbox row.
        assert observer.execute("SELECT count(*) FROM orders_outbox").fetchone() == (0,)
        conn.commit()
        observer.rollback()
        assert observer.execute("SELECT count(*) FROM orders_outbox").fetchone() == (1,)
        assert observer.execute("SELECT count(*) FROM orders").fetchone() == (1,)


def test_unordered_rows_have_no_lane(store: StoreSettings) -> None:
    with psycopg.connect(store.require_dsn()) as conn:
        Outbox(store).write(conn, destination="d", body=b"x")
        conn.commit()
    [row] = outbox_rows(store.require_dsn())
    assert row[1] == -1 and row[2] is None  # lane -1: unordered


def test_psycopg_transaction_block_in_autocommit_mode(store: StoreSettings) -> None:
    outbox = Outbox(store)
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        with pytest.raises(UsageError, match="autocommit"):
            outbox.write(conn, destination="d", body=b"x", key="k")
        with conn.transaction():
            outbox.write(conn, destination="d", body=b"x", key="k")
    assert len(outbox_rows(store.require_dsn())) == 1


def test_sqlalchemy_session_commit_and_rollback(store: StoreSettings, business_table: None) -> None:
    engine = create_engine(sqlalchemy_url(store.require_dsn()))
    outbox = Outbox(store)
    try:
        with Session(engine) as session:
            session.execute(text("INSERT INTO orders VALUES (1, 'a')"))
            outbox.write(session, destination="d", body=b"rolled back", key="a")
            session.rollback()
        with Session(engine) as session, session.begin():
            session.execute(text("INSERT INTO orders VALUES (2, 'b')"))
            outbox.write(session, destination="d", body=b"kept", key="b")
    finally:
        engine.dispose()
    assert [row[5] for row in outbox_rows(store.require_dsn())] == [b"kept"]


def test_sqlalchemy_connection(store: StoreSettings) -> None:
    engine = create_engine(sqlalchemy_url(store.require_dsn()))
    outbox = Outbox(store)
    try:
        with engine.connect() as conn:
            outbox.write_many(conn, [OutboxMessage("d", b"1", key="k"), OutboxMessage("d", b"2")])
            conn.rollback()
        with engine.begin() as conn:
            outbox.write(conn, destination="d", body=b"3", key="k")
    finally:
        engine.dispose()
    assert [row[5] for row in outbox_rows(store.require_dsn())] == [b"3"]


async def test_psycopg_async_commit_and_rollback(store: StoreSettings) -> None:
    outbox = Outbox(store)
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        await outbox.write_async(conn, destination="d", body=b"gone", key="k")
        await conn.rollback()
        await outbox.write_async(conn, destination="d", body=b"kept", key="k")
        await outbox.write_many_async(conn, [OutboxMessage("d", b"many", key="k")])
        await conn.commit()
    assert [row[5] for row in outbox_rows(store.require_dsn())] == [b"kept", b"many"]


async def test_sqlalchemy_async_session_and_connection(store: StoreSettings) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    engine = create_async_engine(sqlalchemy_url(store.require_dsn()))
    outbox = Outbox(store)
    try:
        async with AsyncSession(engine) as session:
            await outbox.write_async(session, destination="d", body=b"gone", key="k")
            await session.rollback()
        async with AsyncSession(engine) as session, session.begin():
            await outbox.write_async(session, destination="d", body=b"session", key="k")
        async with engine.begin() as conn:
            await outbox.write_many_async(conn, [OutboxMessage("d", b"connection", key="k")])
    finally:
        await engine.dispose()
    assert [row[5] for row in outbox_rows(store.require_dsn())] == [b"session", b"connection"]


def test_sync_and_async_faces_are_not_mixed(store: StoreSettings) -> None:
    outbox = Outbox(store)
    with (
        psycopg.connect(store.require_dsn()) as conn,
        pytest.raises(UsageError, match="needs write / write_many"),
    ):
        asyncio.run(outbox.write_async(conn, destination="d", body=b"x"))
    with pytest.raises(UsageError, match="psycopg"):
        outbox.write(object(), destination="d", body=b"x")


def test_other_sqlalchemy_drivers_are_refused_clearly(store: StoreSettings) -> None:
    engine = create_engine("sqlite://")
    with Session(engine) as session, pytest.raises(UsageError, match="postgresql\\+psycopg://"):
        Outbox(store).write(session, destination="d", body=b"x")


def test_write_many_copies_rows_in_order(store: StoreSettings) -> None:
    outbox = Outbox(store)
    messages = [
        OutboxMessage("d", f"{index}".encode(), key=f"k{index % 7}", headers={"n": str(index)})
        for index in range(2_500)
    ]
    with psycopg.connect(store.require_dsn()) as conn:
        ids = outbox.write_many(conn, messages)
        conn.commit()
    rows = outbox_rows(store.require_dsn())
    assert [row[0] for row in rows] == ids
    assert [row[5] for row in rows] == [message.body for message in messages]
    assert all(row[1] == lane_for(row[2], store.lanes) for row in rows)
    assert rows[42][6] == {"n": "42"}


def test_bad_message_in_a_batch_writes_nothing(store: StoreSettings) -> None:
    outbox = Outbox(store)
    messages = [OutboxMessage("d", b"ok", key="k") for _ in range(10)]
    messages.append(OutboxMessage("d", "not bytes", key="k"))  # type: ignore[arg-type]
    with psycopg.connect(store.require_dsn()) as conn:
        with pytest.raises(InvalidMessageError) as caught:
            outbox.write_many(conn, messages)
        conn.commit()
    assert caught.value.field == "messages[10].body"
    assert outbox_rows(store.require_dsn()) == []


def test_lane_count_mismatch_names_both_numbers(store: StoreSettings) -> None:
    wrong = make_store(store.require_dsn(), lanes=store.lanes + 1)
    with psycopg.connect(store.require_dsn()) as conn:
        with pytest.raises(LaneCountMismatchError) as caught:
            Outbox(wrong).write(conn, destination="d", body=b"x", key="k")
        # The check is read-only: the caller's transaction is still usable.
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert f"lanes={store.lanes + 1}" in str(caught.value)
    assert f"lanes={store.lanes}" in str(caught.value)


def test_store_without_schema_is_refused_without_breaking_the_transaction(pg_dsn: str) -> None:
    store = make_store(pg_dsn)
    with psycopg.connect(pg_dsn) as conn:
        with pytest.raises(SchemaNotAppliedError, match="relayer schema apply orders"):
            Outbox(store).write(conn, destination="d", body=b"x", key="k")
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_lane_count_is_checked_once_per_outbox(store: StoreSettings) -> None:
    outbox = Outbox(store)
    with psycopg.connect(store.require_dsn()) as conn:
        outbox.write(conn, destination="d", body=b"x", key="k")
        conn.commit()
        with conn.cursor() as cursor:
            statements: list[str] = []
            conn.add_notice_handler(lambda notice: None)
            original = conn.execute

            def counting(query: Any, params: Any = None, **kwargs: Any) -> Any:
                statements.append(str(query))
                return original(query, params, **kwargs)

            conn.execute = counting  # type: ignore[method-assign]
            outbox.write(conn, destination="d", body=b"x", key="k")
            del cursor
    assert len(statements) == 1 and "INSERT" in statements[0]


def test_one_notification_per_transaction_and_lane_wakes_listeners(store: StoreSettings) -> None:
    """notify = "in_transaction": the NOTIFY is the transaction's own, sent on commit only."""
    store = store.model_copy(update={"notify": "in_transaction"})
    dsn = store.require_dsn()
    outbox = Outbox(store)
    keys = ["k0", "k1", "k2", "k0", "k1", "k1"]
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as writer:
        listener.execute(f'LISTEN "{store.names.notify_channel}"')
        for key in keys:
            outbox.write(writer, destination="d", body=b"x", key=key)
        outbox.write_many(writer, [OutboxMessage("d", b"y", key="k2")])
        outbox.write(writer, destination="d", body=b"x")  # unordered: wakes no lane
        writer.commit()
        select.select([listener.fileno()], [], [], 5)
        received = list(listener.notifies(timeout=0.5))
        # Each lane once (PostgreSQL folds equal payloads of one transaction), on commit only.
        lanes = sorted({str(lane_for(key, store.lanes)) for key in keys})
        assert sorted(notice.payload for notice in received) == lanes
        outbox.write(writer, destination="d", body=b"x", key="k")
        writer.rollback()
        assert list(listener.notifies(timeout=0.3)) == []


@pytest.mark.parametrize("notify", ["in_transaction", "after_commit"])
def test_a_batch_over_many_lanes_sends_one_notification_for_all(
    store: StoreSettings, notify: str
) -> None:
    """One empty payload (every lane) instead of 64; after the commit, the same payload may
    come twice (once while the COPY runs past HOLD, once at the end)."""
    dsn = store.require_dsn()
    wide = make_store(dsn, lanes=64, notify=notify)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM orders_meta")  # re-record: an empty outbox, 64 lanes now
    asyncio.run(apply_schema(wide))
    messages = [OutboxMessage("d", b"x", key=f"key-{index}") for index in range(400)]
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as writer:
        listener.execute(f'LISTEN "{store.names.notify_channel}"')
        outbox = Outbox(wide)
        outbox.write_many(writer, messages)
        writer.commit()
        outbox.flush()  # its wake-ups are sent by now
        select.select([listener.fileno()], [], [], 5)
        payloads = {notice.payload for notice in listener.notifies(timeout=0.5)}
        assert payloads == {""}


def test_after_commit_notifications_wake_each_lane_written_once_committed(
    store: StoreSettings,
) -> None:
    """The default, notify = "after_commit": the application's transaction sends no NOTIFY
    (its statements are the plain ones); relayer's own connection wakes the lanes written once
    the transaction has ended (a rollback too: the workers' probe then finds nothing)."""
    assert store.notify == "after_commit"
    dsn = store.require_dsn()
    outbox = Outbox(store)
    keys = ["k0", "k1", "k2", "k0"]
    try:
        with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as writer:
            listener.execute(f'LISTEN "{store.names.notify_channel}"')
            for key in keys:
                outbox.write(writer, destination="d", body=b"x", key=key)
            outbox.write_many(writer, [OutboxMessage("d", b"y", key="k3")])
            writer.commit()
            lanes = {str(lane_for(key, store.lanes)) for key in [*keys, "k3"]}
            received: set[str] = set()
            for notice in listener.notifies(timeout=30):
                received.add(notice.payload)
                if received >= lanes:
                    break
            assert received == lanes
    finally:
        outbox.flush()


def test_stores_of_one_database_share_one_waker_connection(store: StoreSettings) -> None:
    """Two stores of one database written in one transaction: each store's channel hears its
    own lane, and the process keeps one waker connection to that database, not one a store."""
    other = make_store(store.require_dsn(), name="second", table_prefix="second_", lanes=8)
    asyncio.run(apply_schema(other))
    dsn = store.require_dsn()
    first, second = Outbox(store), Outbox(other)
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as writer:
        for channel in (store.names.notify_channel, other.names.notify_channel):
            listener.execute(f'LISTEN "{channel}"')
        first.write(writer, destination="d", body=b"x", key="a")
        second.write(writer, destination="d", body=b"y", key="b")
        writer.commit()
        expected = {
            (store.names.notify_channel, str(lane_for("a", store.lanes))),
            (other.names.notify_channel, str(lane_for("b", other.lanes))),
        }
        received: set[tuple[str, str]] = set()
        for notice in listener.notifies(timeout=30):
            received.add((notice.channel, notice.payload))
            if received >= expected:
                break
        assert received == expected
        assert first.waker is second.waker
        database = listener.info.dbname
        row = listener.execute(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity "
            "WHERE datname = %s AND application_name = 'relayer:waker'",
            (database,),
        ).fetchone()
        assert row == (1,)


def test_after_commit_statements_carry_no_notify(store: StoreSettings) -> None:
    """What the application's transaction runs in the default mode: the insert alone."""
    from relayer.store.outbox import OutboxStatements
    from relayer.writer.messages import stamp_sequence_numbers

    statements = OutboxStatements(store, stamp_sequence_numbers)
    row = (uuid.uuid4(), 3, "k", None, "d", b"x", None, None)
    statement, parameters = statements._insert_statement(row)  # type: ignore[arg-type]
    assert "pg_notify" not in statement and parameters == row
    assert not statements._wakes_workers([row])  # type: ignore[list-item]
    notifying = OutboxStatements(
        store.model_copy(update={"notify": "in_transaction"}), stamp_sequence_numbers
    )
    assert "pg_notify" in notifying._insert_statement(row)[0]  # type: ignore[arg-type]


async def test_after_commit_wakes_lanes_written_through_an_async_connection(
    store: StoreSettings,
) -> None:
    dsn = store.require_dsn()
    outbox = Outbox(store)
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
            await listener.execute(f'LISTEN "{store.names.notify_channel}"')
            async with await psycopg.AsyncConnection.connect(dsn) as writer:
                await outbox.write_async(writer, destination="d", body=b"x", key="k0")
                await writer.commit()
            lane = str(lane_for("k0", store.lanes))
            async with asyncio.timeout(30):
                async for notice in listener.notifies():
                    if notice.payload == lane:
                        break
    finally:
        outbox.flush()


def test_notify_can_be_turned_off(store: StoreSettings) -> None:
    quiet = store.model_copy(update={"notify": False})
    dsn = store.require_dsn()
    with psycopg.connect(dsn, autocommit=True) as listener, psycopg.connect(dsn) as writer:
        listener.execute(f'LISTEN "{store.names.notify_channel}"')
        Outbox(quiet).write(writer, destination="d", body=b"x", key="k")
        writer.commit()
        assert list(listener.notifies(timeout=0.3)) == []


def test_deliver_at_is_stored(store: StoreSettings) -> None:
    due = datetime.now(UTC) + timedelta(minutes=5)
    with psycopg.connect(store.require_dsn()) as conn:
        Outbox(store).write(conn, destination="d", body=b"x", key="k", deliver_at=due)
        conn.commit()
    assert outbox_rows(store.require_dsn())[0][7] == due
