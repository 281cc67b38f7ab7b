"""The end-to-end demo behind ``make demo`` / ``relayer demo``.

It uses a configured PostgreSQL (``--dsn`` or ``RELAYER_DSN``) or starts an embedded one,
applies the schema of a demo store, writes sample orders with their outbox rows in the same
transactions, and shows what it wrote per lane.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from relayer import schema
from relayer.connection import connect
from relayer.settings import StoreSettings, store_settings
from relayer.writer import Outbox

DEMO_SCHEMA = "relayer_demo"


@dataclass(frozen=True, slots=True)
class LaneSummary:
    lane: int
    rows: int
    keys: int


@contextlib.asynccontextmanager
async def demo_database(dsn: str | None, say: Callable[[str], None]) -> AsyncIterator[str]:
    """The configured DSN, or an embedded PostgreSQL for the duration of the demo."""
    if dsn:
        yield dsn
        return
    from relayer.embedded import EmbeddedPostgres

    say("starting an embedded PostgreSQL (no DSN configured) ...")
    with EmbeddedPostgres() as server:
        say(f"  embedded PostgreSQL on 127.0.0.1:{server.port}")
        yield server.dsn


def demo_store(dsn: str, lanes: int = 8) -> StoreSettings:
    return store_settings(
        name="demo", dsn=dsn, schema=DEMO_SCHEMA, table_prefix="orders_", lanes=lanes
    )


async def prepare(store: StoreSettings) -> schema.ApplyResult:
    """Reset the demo's own schema, apply the store's tables and create the business table."""
    async with await connect(store, purpose="demo") as conn:
        await conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(DEMO_SCHEMA))
        )
        result = await schema.apply(conn, store)
        await conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, customer text NOT NULL, "
                "amount_cents integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
            ).format(sql.Identifier(DEMO_SCHEMA, "orders"))
        )
    return result


async def write_orders(store: StoreSettings, orders: int, customers: int) -> float:
    """One transaction per order: the business row and its outbox row together."""
    outbox = Outbox(store)
    insert = sql.SQL("INSERT INTO {} (id, customer, amount_cents) VALUES (%s, %s, %s)").format(
        sql.Identifier(DEMO_SCHEMA, "orders")
    )
    rng = random.Random(7)
    started = time.perf_counter()
    async with await connect(store, autocommit=False, purpose="demo-writer") as conn:
        for order_id in range(1, orders + 1):
            customer = f"customer-{rng.randrange(customers):03d}"
            amount = rng.randrange(100, 50_000)
            await conn.execute(insert, (order_id, customer, amount))
            event = {
                "type": "OrderPlaced",
                "order_id": order_id,
                "customer": customer,
                "amount_cents": amount,
            }
            await outbox.write_async(
                conn,
                destination="orders",
                key=customer,
                body=json.dumps(event).encode(),
                headers={"event-type": "OrderPlaced"},
            )
            await conn.commit()
    return time.perf_counter() - started


async def lane_summary(store: StoreSettings) -> list[LaneSummary]:
    query = sql.SQL(
        "SELECT lane, count(*), count(DISTINCT ordering_key) FROM {} "
        "WHERE lane IS NOT NULL GROUP BY lane ORDER BY lane"
    ).format(sql.Identifier(store.db_schema, store.names.table("outbox")))
    async with await connect(store, purpose="demo") as conn:
        cursor = await conn.execute(query)
        rows: list[Any] = await cursor.fetchall()
    return [LaneSummary(int(lane), int(count), int(keys)) for lane, count, keys in rows]


async def run_demo(
    dsn: str | None, orders: int, customers: int, say: Callable[[str], None]
) -> None:
    async with demo_database(dsn, say) as database:
        store = demo_store(database)
        result = await prepare(store)
        say(
            f"store 'demo' ({DEMO_SCHEMA}.orders_*): schema version {result.schema_version}, "
            f"{result.lanes} lanes"
        )
        say(f"writing {orders} orders for {customers} customers, one transaction each ...")
        elapsed = await write_orders(store, orders, customers)
        say(f"  {orders} business rows + {orders} outbox rows in {elapsed:.2f} s")
        summary = await lane_summary(store)
        say("")
        say("lane  rows  keys")
        for lane in summary:
            say(f"{lane.lane:>4}  {lane.rows:>4}  {lane.keys:>4}")
        total = sum(lane.rows for lane in summary)
        say(f"total {total:>4}  {sum(lane.keys for lane in summary):>4}")
        if total != orders:
            raise psycopg.DataError(f"expected {orders} outbox rows, found {total}")
