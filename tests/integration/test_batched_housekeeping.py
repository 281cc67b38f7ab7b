"""The heartbeats and idle probes the stores of one database send together on their shared
housekeeping connection (relayer.store.housekeeping), on real PostgreSQL: what is asked in one
event-loop turn goes in one round trip and answers as if asked alone; one store whose
statement fails fails no other."""

from __future__ import annotations

import asyncio

import psycopg

from relayer import Outbox
from relayer.errors import StoreError
from relayer.relay.membership import Membership
from relayer.settings import StoreSettings, WorkerSettings
from relayer.store import RelayStore
from relayer.store.databases import Database, Databases
from tests.conftest import apply_schema, make_store


async def stores_of_one_database(dsn: str, count: int) -> list[StoreSettings]:
    stores = [make_store(dsn, name=f"s{n}", table_prefix=f"s{n}_", lanes=4) for n in range(count)]
    for store in stores:
        await apply_schema(store)
    return stores


async def attached(stores: list[StoreSettings]) -> Database:
    database = Databases(WorkerSettings(), limit=10).get(stores[0])
    for store in stores:
        await database.attach(store)
    return database


async def detach(database: Database, stores: list[StoreSettings]) -> None:
    for store in stores:
        await database.detach(store)


def members(database: Database, stores: list[StoreSettings], member: str) -> list[Membership]:
    return [
        Membership(
            store,
            member,
            session=database.housekeeping.for_store(store),
            batched=database.batched,
        )
        for store in stores
    ]


async def test_heartbeats_of_one_turn_go_together_and_answer_as_alone(pg_dsn: str) -> None:
    stores = await stores_of_one_database(pg_dsn, 3)
    database = await attached(stores)
    try:
        other = members(database, stores, "b-other")
        await asyncio.gather(*(membership.beat() for membership in other))
        assert database.batched.batches == 1
        mine = members(database, stores, "a-mine")
        await asyncio.gather(*(membership.beat() for membership in mine))
        assert database.batched.batches == 2
        for membership in mine:
            assert membership.members == ("a-mine", "b-other")
            assert (membership.rank, membership.lanes) == (0, frozenset({0, 2}))
        alone = Membership(stores[0], "a-mine", session=database.housekeeping.for_store(stores[0]))
        await alone.beat()  # the statement on its own sees the same
        assert (alone.members, alone.lanes) == (mine[0].members, mine[0].lanes)
    finally:
        await detach(database, stores)


async def test_a_store_whose_heartbeat_fails_fails_no_other(pg_dsn: str) -> None:
    stores = await stores_of_one_database(pg_dsn, 3)
    database = await attached(stores)
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {stores[1].table_prefix}leases")
        beating = members(database, stores, "m")
        outcomes = await asyncio.gather(
            *(membership.beat() for membership in beating), return_exceptions=True
        )
        assert outcomes[0] is None and outcomes[2] is None
        assert isinstance(outcomes[1], StoreError) and "'s1'" in str(outcomes[1])
        assert beating[0].lanes == beating[2].lanes == frozenset(range(4))
        # The failing store beats alone from now on: the others still go together.
        outcomes = await asyncio.gather(
            *(membership.beat() for membership in beating), return_exceptions=True
        )
        assert isinstance(outcomes[1], StoreError)
        assert outcomes[0] is None and outcomes[2] is None
    finally:
        await detach(database, stores)


async def test_idle_stores_are_asked_for_rows_in_one_statement(pg_dsn: str) -> None:
    stores = await stores_of_one_database(pg_dsn, 3)
    with psycopg.connect(pg_dsn) as conn:
        Outbox(stores[1]).write(conn, destination="d", body=b"x", key="k")
        Outbox(stores[2]).write(conn, destination="d", body=b"x")  # unordered: in no lane
        conn.commit()
    database = await attached(stores)
    try:
        found = await asyncio.gather(
            *(database.batched.holds_rows(RelayStore(store)) for store in stores)
        )
        assert found == [False, True, False]
        assert database.batched.batches == 1
        # Alone in its turn, a store is not asked: it probes its share at once.
        assert await database.batched.holds_rows(RelayStore(stores[0]))
        assert database.batched.batches == 1
    finally:
        await detach(database, stores)


async def test_idle_stores_probe_their_share_when_the_shared_question_fails(
    pg_dsn: str,
) -> None:
    stores = await stores_of_one_database(pg_dsn, 2)
    database = await attached(stores)
    try:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {stores[0].table_prefix}outbox CASCADE")
        found = await asyncio.gather(
            *(database.batched.holds_rows(RelayStore(store)) for store in stores)
        )
        assert found == [True, True]
    finally:
        await detach(database, stores)
