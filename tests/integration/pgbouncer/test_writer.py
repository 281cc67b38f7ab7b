"""The writer and the inbox on applications' connections through PgBouncer in transaction mode:
many clients, each past psycopg's prepare threshold (5 runs of a statement), share two server
connections; none of relayer's statements may be prepared on one of them."""

from __future__ import annotations

import psycopg
import pytest

from relayer import Inbox, Outbox, OutboxMessage
from relayer.settings import StoreSettings
from tests.integration.pgbouncer.helpers import BOUNCERS, bouncer_of, pooled
from tests.integration.relay.helpers import pending

CLIENTS = 6
ROUNDS = 12  # transactions per client, past the threshold of every statement


@pytest.fixture(params=BOUNCERS)
def through(request: pytest.FixtureRequest, store: StoreSettings) -> StoreSettings:
    return pooled(store, bouncer_of(request), sequence_numbers=True)


def test_sync_writers_share_server_connections(through: StoreSettings) -> None:
    outbox = Outbox(through)
    clients = [psycopg.connect(through.require_dsn()) for _ in range(CLIENTS)]
    try:
        for round_number in range(ROUNDS):
            for number, conn in enumerate(clients):  # interleaved: other server connections
                key = f"key-{number}"
                outbox.write(conn, destination="events", body=b"one", key=key)
                outbox.write(conn, destination="events", body=b"unordered")
                outbox.write_many(
                    conn,
                    [OutboxMessage("events", f"{round_number}".encode(), key=key)] * 2,
                )
                conn.commit()
    finally:
        for conn in clients:
            conn.close()
    assert pending(through) == CLIENTS * ROUNDS * 4
    assert sequences(through) == {
        f"key-{n}": list(range(1, ROUNDS * 3 + 1)) for n in range(CLIENTS)
    }


async def test_async_writers_and_inboxes_share_server_connections(
    through: StoreSettings,
) -> None:
    outbox, inbox = Outbox(through), Inbox(through)
    clients = [await psycopg.AsyncConnection.connect(through.require_dsn()) for _ in range(CLIENTS)]
    try:
        for round_number in range(ROUNDS):
            for number, conn in enumerate(clients):
                key = f"key-{number}"
                message_id = await outbox.write_async(
                    conn, destination="events", body=b"one", key=key
                )
                await outbox.write_many_async(
                    conn, [OutboxMessage("events", f"{round_number}".encode(), key=key)]
                )
                assert await inbox.claim_async(conn, message_id, "billing")
                assert not await inbox.claim_async(conn, message_id, "billing")
                await conn.commit()
    finally:
        for conn in clients:
            await conn.close()
    assert pending(through) == CLIENTS * ROUNDS * 2


def sequences(store: StoreSettings) -> dict[str, list[int]]:
    """key -> the sequence numbers its rows carry, in id order."""
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute(
            f"SELECT ordering_key, (headers->>'relayer-sequence')::int "
            f"FROM {store.table_prefix}outbox WHERE ordering_key IS NOT NULL ORDER BY id"
        ).fetchall()
    found: dict[str, list[int]] = {}
    for key, number in rows:
        found.setdefault(key, []).append(number)
    return found
