import asyncio

import psycopg
import pytest
from psycopg import sql

from relayer.errors import LaneCountMismatchError, SchemaNotAppliedError
from relayer.operations import schema
from relayer.settings import StoreSettings
from tests.conftest import apply_schema, make_store


async def tables_in(dsn: str, schema_name: str) -> set[str]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema_name,)
        )
        return {row[0] for row in await cursor.fetchall()}


async def test_apply_creates_every_table_and_records_lanes(pg_dsn: str) -> None:
    store = make_store(pg_dsn, schema="messaging", lanes=32)
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        result = await schema.apply(conn, store)
        assert result.applied[0] == "0001_initial"
        meta = await schema.require_meta(conn, store)
    assert meta.lanes == 32
    assert meta.schema_version == schema.latest_version()
    tables = await tables_in(pg_dsn, "messaging")
    assert {"orders_outbox", "orders_leases", "orders_parked", "orders_meta"} <= tables
    assert "orders_migrations" in tables


async def test_apply_twice_is_a_no_op(pg_dsn: str) -> None:
    store = make_store(pg_dsn)
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        first = await schema.apply(conn, store)
        second = await schema.apply(conn, store)
        assert first.applied
        assert second.applied == ()
        assert await schema.check(conn, store) == []


async def test_concurrent_apply_is_safe(pg_dsn: str) -> None:
    store = make_store(pg_dsn, schema="fresh_schema")

    async def one() -> schema.ApplyResult:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            return await schema.apply(conn, store)

    results = await asyncio.gather(*(one() for _ in range(6)))
    applied = [result.applied for result in results if result.applied]
    assert len(applied) == 1  # exactly one connection ran the migrations
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        assert await schema.check(conn, store) == []
        cursor = await conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier("fresh_schema", "orders_migrations")
            )
        )
        row = await cursor.fetchone()
        assert row is not None and row[0] == len(schema.migrations())


async def test_check_reports_drift(store: StoreSettings) -> None:
    dsn = store.require_dsn()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("ALTER TABLE orders_outbox DROP COLUMN last_error")
        await conn.execute("ALTER TABLE orders_outbox ALTER COLUMN attempts TYPE bigint")
        await conn.execute("DROP INDEX orders_parked_lane")
        await conn.execute("ALTER TABLE orders_leases ADD COLUMN surprise text")
        drift = [str(item) for item in await schema.check(conn, store)]
    assert "public.orders_outbox: column last_error missing" in drift
    assert any("column attempts is bigint NOT NULL" in item for item in drift)
    assert "public.orders_parked: index orders_parked_lane missing" in drift
    assert any("surprise is not part of relayer's schema" in item for item in drift)


async def test_check_reports_missing_schema_and_lane_mismatch(pg_dsn: str) -> None:
    store = make_store(pg_dsn)
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        assert "never applied" in str((await schema.check(conn, store))[0])
        await schema.apply(conn, store)
        other = make_store(pg_dsn, lanes=store.lanes * 2)
        assert [str(item) for item in await schema.check(conn, other)] == [
            f"lanes: recorded {store.lanes}, configured {store.lanes * 2}"
        ]


async def test_changed_migration_text_is_drift(store: StoreSettings) -> None:
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        await conn.execute("UPDATE orders_migrations SET checksum = 'edited' WHERE version = 1")
        drift = [str(item) for item in await schema.check(conn, store)]
    assert drift == ["migration 0001_initial: its text changed since it was applied"]


async def test_lane_count_changes_only_on_an_empty_outbox(store: StoreSettings) -> None:
    dsn = store.require_dsn()
    wider = make_store(dsn, lanes=store.lanes * 4)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        result = await schema.apply(conn, wider)
        assert result.lanes_changed_from == store.lanes
        assert (await schema.require_meta(conn, wider)).lanes == wider.lanes
        await conn.execute(
            "INSERT INTO orders_outbox (id, lane, ordering_key, destination, body) "
            "VALUES (gen_random_uuid(), 1, 'k', 'd', '')"
        )
        with pytest.raises(LaneCountMismatchError) as caught:
            await schema.apply(conn, store)
    assert f"lanes={store.lanes}" in str(caught.value)
    assert f"lanes={wider.lanes}" in str(caught.value)


async def test_require_meta_refuses_a_store_that_was_never_applied(pg_dsn: str) -> None:
    store = make_store(pg_dsn)
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        with pytest.raises(SchemaNotAppliedError, match="relayer schema apply orders"):
            await schema.require_meta(conn, store)


async def test_render_matches_what_apply_creates(pg_dsn: str) -> None:
    store = make_store(pg_dsn, schema="printed")
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute(schema.render(store))  # type: ignore[arg-type]
        assert await schema.check(conn, store) == []
        again = await schema.apply(conn, store)
        assert again.applied == ()


async def test_prefixes_separate_stores_in_one_schema(pg_dsn: str) -> None:
    await apply_schema(make_store(pg_dsn, table_prefix="a_"))
    await apply_schema(make_store(pg_dsn, table_prefix="b_", lanes=3))
    tables = await tables_in(pg_dsn, "public")
    assert {"a_outbox", "b_outbox"} <= tables
