"""The inbox on real PostgreSQL: duplicates, concurrent claims, rollbacks, sequence verdicts."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from relayer.errors import InvalidMessageError, SchemaNotAppliedError, UsageError
from relayer.inbox import Claim, Inbox, Outcome
from relayer.settings import StoreSettings
from tests.conftest import make_store


def test_first_claim_is_true_and_a_duplicate_false(store: StoreSettings) -> None:
    inbox = Inbox(store)
    message = uuid.uuid4()
    with psycopg.connect(store.require_dsn()) as conn:
        first = inbox.claim(conn, message, "billing")
        again = inbox.claim(conn, str(message), "billing")
        other_consumer = inbox.claim(conn, message, "emails")
        conn.commit()
        later = inbox.claim(conn, message, "billing")
    assert first and first.outcome is Outcome.NEW
    assert not again and again.outcome is Outcome.DUPLICATE
    assert other_consumer  # each consumer name has its own inbox
    assert not later


def test_a_rolled_back_claim_can_be_claimed_again(store: StoreSettings) -> None:
    inbox = Inbox(store)
    message = uuid.uuid4()
    with psycopg.connect(store.require_dsn()) as conn:
        assert inbox.claim(conn, message, "billing")
        conn.rollback()  # the consumer's work failed: the claim goes with it
        assert inbox.claim(conn, message, "billing")
        conn.commit()


async def backend_waits(dsn: str, pid: int) -> None:
    """Until the backend ``pid`` waits for a lock (bounded by the test's own timeout)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        while True:
            cursor = await admin.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
            )
            row = await cursor.fetchone()
            if row is not None and row[0] == "Lock":
                return
            await asyncio.sleep(0.02)


@pytest.mark.parametrize(
    ("first_ends", "second_gets"), [("commit", Outcome.DUPLICATE), ("rollback", Outcome.NEW)]
)
async def test_concurrent_claims_of_one_message_take_turns(
    store: StoreSettings, first_ends: str, second_gets: Outcome
) -> None:
    inbox = Inbox(store)
    message = uuid.uuid4()
    dsn = store.require_dsn()
    async with (
        await psycopg.AsyncConnection.connect(dsn) as first,
        await psycopg.AsyncConnection.connect(dsn) as second,
    ):
        assert await inbox.claim_async(first, message, "billing")
        waiting = asyncio.create_task(inbox.claim_async(second, message, "billing"))
        await asyncio.wait_for(backend_waits(dsn, second.info.backend_pid), 10)
        assert not waiting.done()
        await (first.commit() if first_ends == "commit" else first.rollback())
        claim = await asyncio.wait_for(waiting, 10)
        await second.commit()
    assert claim.outcome is second_gets


def test_sequences_report_order_gaps_and_late_arrivals(store: StoreSettings) -> None:
    inbox = Inbox(store)
    with psycopg.connect(store.require_dsn()) as conn:

        def claim(sequence: int, key: str = "order-1", consumer: str = "billing") -> Claim:
            return inbox.claim(conn, uuid.uuid4(), consumer, key=key, sequence=sequence)

        first = claim(1)
        second = claim(2)
        gap = claim(5)
        late = claim(3)
        after_gap = claim(6)
        other_key = claim(4, key="order-2")
        other_consumer = claim(2, consumer="emails")
        conn.commit()
    assert first.outcome is Outcome.IN_ORDER
    assert second.outcome is Outcome.IN_ORDER
    assert gap.outcome is Outcome.GAP and list(gap.missing) == [3, 4]
    assert late.outcome is Outcome.REORDERED and late
    assert late.previous == 5
    assert after_gap.outcome is Outcome.IN_ORDER
    assert other_key.outcome is Outcome.NEW
    assert other_consumer.outcome is Outcome.NEW


def test_a_duplicate_leaves_the_key_state_alone(store: StoreSettings) -> None:
    inbox = Inbox(store)
    message = uuid.uuid4()
    with psycopg.connect(store.require_dsn()) as conn:
        assert inbox.claim(conn, message, "billing", key="k", sequence=1)
        duplicate = inbox.claim(conn, message, "billing", key="k", sequence=1)
        following = inbox.claim(conn, uuid.uuid4(), "billing", key="k", sequence=2)
        conn.commit()
    assert duplicate.outcome is Outcome.DUPLICATE
    assert following.outcome is Outcome.IN_ORDER


def test_sqlalchemy_session_joins_the_consumers_transaction(store: StoreSettings) -> None:
    engine = create_engine(store.require_dsn().replace("postgresql://", "postgresql+psycopg://", 1))
    inbox = Inbox(store)
    message = uuid.uuid4()
    try:
        with Session(engine) as session:
            assert inbox.claim(session, message, "billing")
            session.rollback()
        with Session(engine) as session, session.begin():
            assert inbox.claim(session, message, "billing")
        with Session(engine) as session:
            assert not inbox.claim(session, message, "billing")
    finally:
        engine.dispose()


async def test_misuse_is_refused_clearly(store: StoreSettings, pg_dsn: str) -> None:
    inbox = Inbox(store)
    with (
        psycopg.connect(store.require_dsn(), autocommit=True) as conn,
        pytest.raises(UsageError, match="autocommit"),
    ):
        inbox.claim(conn, uuid.uuid4(), "billing")
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as aconn:
        with pytest.raises(UsageError, match="needs claim_async / claim_message_async"):
            inbox.claim(aconn, uuid.uuid4(), "billing")
    with pytest.raises(InvalidMessageError, match="message_id"):
        inbox.claim(object(), "not-a-uuid", "billing")
    with pytest.raises(InvalidMessageError, match="needs the key"):
        inbox.claim(object(), uuid.uuid4(), "billing", sequence=3)
    missing = Inbox(make_store(pg_dsn, schema="nowhere"))
    with psycopg.connect(pg_dsn) as conn, pytest.raises(SchemaNotAppliedError):
        missing.claim(conn, uuid.uuid4(), "billing")
