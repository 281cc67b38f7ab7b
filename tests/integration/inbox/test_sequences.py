"""Writer-side sequence numbers: stamped per key in order, gapless under rollback, serialized
between concurrent writers of one key (and ids taken after the lock, in the same order)."""

from __future__ import annotations

import asyncio
import json
from uuid import UUID

import psycopg
import pytest

from relayer import Outbox, OutboxMessage
from relayer.errors import InvalidMessageError
from relayer.settings import StoreSettings
from relayer.writer.messages import validate
from relayer.writer.sequences import SEQUENCE_HEADER
from tests.conftest import apply_schema, make_store
from tests.integration.inbox.test_claims import backend_waits


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    settings = make_store(pg_dsn, sequence_numbers=True)
    await apply_schema(settings)
    return settings


def stamped(store: StoreSettings) -> dict[UUID, str | None]:
    with psycopg.connect(store.require_dsn()) as conn:
        found = conn.execute(f"SELECT id, headers FROM {store.table_prefix}outbox").fetchall()
    return {row[0]: row[1].get(SEQUENCE_HEADER) for row in found}


def test_each_key_is_numbered_in_write_order(store: StoreSettings) -> None:
    outbox = Outbox(store)
    with psycopg.connect(store.require_dsn()) as conn:
        first = outbox.write_many(
            conn,
            [
                OutboxMessage("d", b"a1", key="a", headers={"kind": "x"}),
                OutboxMessage("d", b"b1", key="b"),
                OutboxMessage("d", b"a2", key="a"),
                OutboxMessage("d", b"free"),
            ],
        )
        later = outbox.write(conn, destination="d", body=b"a3", key="a")
        conn.commit()
    numbers = stamped(store)
    assert [numbers[i] for i in first] == ["1", "1", "2", None]
    assert numbers[later] == "3"
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(
            f"SELECT headers::text FROM {store.table_prefix}outbox WHERE id = %s", (first[0],)
        ).fetchone()
    assert row is not None and json.loads(row[0]) == {"kind": "x", SEQUENCE_HEADER: "1"}


def test_the_header_is_reserved(store: StoreSettings) -> None:
    with pytest.raises(InvalidMessageError, match="reserved"):
        validate(store, OutboxMessage("d", b"x", key="k", headers={SEQUENCE_HEADER: "9"}))


@pytest.mark.parametrize(("first_ends", "second_number"), [("rollback", "1"), ("commit", "2")])
async def test_concurrent_writers_of_a_key_take_turns(
    store: StoreSettings, first_ends: str, second_number: str
) -> None:
    outbox = Outbox(store)
    dsn = store.require_dsn()
    async with (
        await psycopg.AsyncConnection.connect(dsn) as first,
        await psycopg.AsyncConnection.connect(dsn) as second,
    ):
        first_id = await outbox.write_async(first, destination="d", body=b"1", key="k")
        waiting = asyncio.create_task(
            outbox.write_many_async(second, [OutboxMessage("d", b"2", key="k")])
        )
        await asyncio.wait_for(backend_waits(dsn, second.info.backend_pid), 10)
        await (first.commit() if first_ends == "commit" else first.rollback())
        [second_id] = await asyncio.wait_for(waiting, 10)
        await second.commit()
    numbers = stamped(store)
    assert numbers[second_id] == second_number  # gapless: a rollback gives its number back
    if first_ends == "commit":
        assert numbers[first_id] == "1"
        assert second_id > first_id  # the id is taken after the counter's lock
