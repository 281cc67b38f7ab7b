"""After-commit dispatch of unordered rows, with the memory transport: psycopg (async and
sync) and SQLAlchemy sessions; rollbacks, misuse, an unreachable broker and failing rows."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

from relayer import Outbox, OutboxMessage
from relayer.errors import UsageError
from relayer.settings import StoreSettings
from relayer.transports.memory import MemoryTransport
from relayer.writer.after_commit import BackgroundDispatcher, UnorderedDispatcher
from tests.integration.unordered.helpers import memory_store, rows


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    return await memory_store(pg_dsn)


@pytest.fixture
async def memory() -> MemoryTransport:
    transport = MemoryTransport("memory")
    await transport.start()
    return transport


@contextlib.asynccontextmanager
async def dispatching(
    store: StoreSettings, memory: MemoryTransport
) -> AsyncIterator[tuple[Outbox, UnorderedDispatcher, psycopg.AsyncConnection[Any]]]:
    outbox = Outbox(store)
    async with (
        UnorderedDispatcher(outbox, {"memory": memory}) as dispatcher,
        await psycopg.AsyncConnection.connect(store.require_dsn()) as conn,
    ):
        yield outbox, dispatcher, conn


def sqlalchemy_url(store: StoreSettings) -> str:
    return store.require_dsn().replace("postgresql://", "postgresql+psycopg://", 1)


async def test_commit_then_dispatch_sends_and_deletes(
    store: StoreSettings, memory: MemoryTransport
) -> None:
    async with dispatching(store, memory) as (outbox, dispatcher, conn):
        unordered = await outbox.write_many_async(
            conn, [OutboxMessage("emails", f"mail {n}".encode()) for n in range(3)]
        )
        ordered = await outbox.write_async(conn, destination="orders", body=b"o", key="k")
        await conn.commit()
        result = await dispatcher.dispatch_after_commit(conn)
        again = await dispatcher.dispatch_after_commit(conn)
        assert (dispatcher.sent, dispatcher.failed) == (3, 0)  # running totals, for metrics
    assert (result.claimed, result.sent, result.failed, result.error) == (3, 3, 0, "")
    assert again.claimed == 0  # the ids were taken by the first dispatch
    assert {message.id for message in memory.received("emails")} == set(unordered)
    assert memory.received("orders") == []  # ordered rows belong to the workers
    assert set(rows(store)) == {ordered}


async def test_rolled_back_rows_are_never_sent(
    store: StoreSettings, memory: MemoryTransport
) -> None:
    async with dispatching(store, memory) as (outbox, dispatcher, conn):
        await outbox.write_async(conn, destination="emails", body=b"rolled back")
        await conn.rollback()
        kept = await outbox.write_async(conn, destination="emails", body=b"committed")
        await conn.commit()
        result = await dispatcher.dispatch_after_commit(conn)
        await outbox.write_async(conn, destination="emails", body=b"forgotten")
        await conn.rollback()
        assert dispatcher.forget(conn) == 1
    assert result.sent == 1
    assert [message.id for message in memory.received("emails")] == [kept]
    assert rows(store) == {}


async def test_dispatch_inside_the_transaction_is_refused(
    store: StoreSettings, memory: MemoryTransport
) -> None:
    async with dispatching(store, memory) as (outbox, dispatcher, conn):
        await outbox.write_async(conn, destination="emails", body=b"x")
        with pytest.raises(UsageError, match=r"after conn\.commit\(\)"):
            await dispatcher.dispatch_after_commit(conn)
        await conn.commit()
        assert (await dispatcher.dispatch_after_commit(conn)).sent == 1
    UnorderedDispatcher(outbox, {"memory": memory})  # closing the first one detached it
    with pytest.raises(UsageError, match="already has an after-commit dispatcher"):
        UnorderedDispatcher(outbox, {"memory": memory})


async def test_an_unreachable_broker_leaves_rows_for_recovery(
    store: StoreSettings, memory: MemoryTransport
) -> None:
    memory.disconnect()
    async with dispatching(store, memory) as (outbox, dispatcher, conn):
        ids = await outbox.write_many_async(conn, [OutboxMessage("emails", b"x")] * 2)
        await conn.commit()  # the commit never depends on the broker
        result = await dispatcher.dispatch_after_commit(conn)
    assert result.sent == 0 and "injected connection loss" in result.error
    assert rows(store) == {ids[0]: (0, None, None), ids[1]: (0, None, None)}  # no attempt counted


async def test_a_failing_row_is_retried_later_and_the_others_go(
    store: StoreSettings, memory: MemoryTransport
) -> None:
    async with dispatching(store, memory) as (outbox, dispatcher, conn):
        ids = await outbox.write_many_async(
            conn, [OutboxMessage("emails", b"x"), OutboxMessage("emails", b"y")]
        )
        await conn.commit()
        memory.fail_message(ids[0], message="mailbox full")
        memory.fail_message(ids[1], retryable=False, message="no such topic")
        result = await dispatcher.dispatch(ids)
        assert (dispatcher.sent, dispatcher.failed) == (0, 2)
    assert (result.sent, result.failed) == (0, 2)
    found = rows(store)
    attempts, error, retry_in = found[ids[0]]
    assert (attempts, error) == (1, "mailbox full")
    assert 0 < retry_in <= 0.5  # retry_backoff
    attempts, error, retry_in = found[ids[1]]
    assert (attempts, error) == (1, "no such topic")
    assert retry_in > 3000  # a permanent error waits retry_backoff_max (1 h)


def test_background_dispatcher_for_sync_psycopg_and_sqlalchemy(store: StoreSettings) -> None:
    outbox = Outbox(store)
    memory = MemoryTransport("memory")  # started on the dispatcher's own loop
    engine = create_engine(sqlalchemy_url(store))
    sessions = sessionmaker(engine)
    try:
        with BackgroundDispatcher(outbox, {"memory": memory}) as dispatcher:
            with psycopg.connect(store.require_dsn()) as conn:
                direct = outbox.write(conn, destination="emails", body=b"psycopg")
                conn.commit()
                result = dispatcher.dispatch_after_commit(conn)
            dispatcher.attach(sessions)
            with sessions() as session, session.begin():
                hooked = outbox.write(session, destination="emails", body=b"session")
            with sessions() as session:
                outbox.write(session, destination="emails", body=b"rolled back")
                session.rollback()
            assert len(dispatcher.dispatcher.pending) == 0  # forgotten by after_rollback
        # close() waited for the dispatch the commit started
        assert result is not None and result.sent == 1
        assert {message.id for message in memory.received("emails")} == {direct, hooked}
        assert rows(store) == {}
    finally:
        engine.dispose()


async def test_async_session_commit_dispatches(
    store: StoreSettings, memory: MemoryTransport
) -> None:
    outbox = Outbox(store)
    engine = create_async_engine(sqlalchemy_url(store))
    try:
        dispatcher = UnorderedDispatcher(outbox, {"memory": memory})
        await dispatcher.start()
        async with AsyncSession(engine) as session:
            dispatcher.attach(session)
            async with session.begin():
                written = await outbox.write_async(session, destination="emails", body=b"a")
        await dispatcher.close()  # waits for the dispatch started by the commit
        assert [message.id for message in memory.received("emails")] == [written]
        assert rows(store) == {}
    finally:
        await engine.dispose()


def test_a_sync_session_with_the_sync_session_class_must_be_explicit(
    store: StoreSettings,
) -> None:
    from sqlalchemy.ext.asyncio import async_sessionmaker

    dispatcher = BackgroundDispatcher(Outbox(store), {"memory": MemoryTransport("memory")})
    with pytest.raises(UsageError, match="sync_session_class"):
        dispatcher.attach(async_sessionmaker())
    with pytest.raises(UsageError, match="not started"):
        dispatcher.dispatch_after_commit(Session())


async def test_a_failed_start_closes_what_it_started(store: StoreSettings) -> None:
    from relayer.errors import TransportError

    failing = MemoryTransport("memory")
    failing.fail_start()
    outbox = Outbox(store)
    dispatcher = UnorderedDispatcher(outbox, {"memory": failing}, owns_transports=True)
    with pytest.raises(TransportError, match="injected start failure"):
        await dispatcher.start()
    assert outbox.on_unordered is None  # detached: a new dispatcher may be attached
    with pytest.raises(UsageError, match="not started"):
        await dispatcher.dispatch([uuid.uuid4()])
