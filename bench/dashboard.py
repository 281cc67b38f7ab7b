"""The dashboard's snapshot at scale: 65,536 lanes, many rows, 10,000 parked keys.

    python bench/dashboard.py [--lanes 65536] [--rows 1000000] [--parked 10000] [--rounds 5]
                              [--storage delete|partitioned] [--sent 0.5]

Fills a scratch schema (rows generated in SQL, every lane busy; with --storage partitioned,
each lane's progress moved past the --sent share of its rows, which stay in the outbox as sent
rows do until their partition is dropped), then times the sampler's
whole snapshot and each of its statements, the background refinement (pending rows per lane)
and a parked-keys page. Prints the figures; never asserts on time. The budget of
docs/dashboard.md is a snapshot under 200 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import sql

from bench.common import machine, postgres, scratch_schema, server_version
from relayer.dashboard.sampler import COUNT_CAP, PARKED_CAP, StoreSampler
from relayer.operations import schema
from relayer.settings import StoreSettings, store_settings
from relayer.sql import queries_for
from relayer.store.dashboard import DashboardPool, without_jit
from relayer.store.inspection import ParkedFilter, parked_page

FILL = """
INSERT INTO {outbox} (id, lane, ordering_key, destination, body)
SELECT (pg_catalog.lpad(pg_catalog.to_hex(
            (extract(epoch FROM pg_catalog.now()) * 1000)::int8 - 600000 + n / %(lanes)s), 12, '0')
        || '7' || pg_catalog.substr(pg_catalog.md5(n::text), 1, 3) || '8'
        || pg_catalog.substr(pg_catalog.md5(n::text), 4, 15))::uuid,
       n %% %(lanes)s, 'key-' || (n %% %(lanes)s), 'events', '\\x00'::bytea
FROM pg_catalog.generate_series(0, %(rows)s - 1) AS n
"""
PARK = """
INSERT INTO {parked} (ordering_key, lane, head_id, attempts, last_error, retry_at)
SELECT 'parked-' || n, n %% %(lanes)s, pg_catalog.gen_random_uuid(), 3,
       'broker refused: error ' || (n %% 7), NULL
FROM pg_catalog.generate_series(0, %(parked)s - 1) AS n
"""
# Partitioned storage: each lane's progress past the first SENT share of its rows (as if sent).
PROGRESS = """
UPDATE {progress} AS g SET done_id = s.id
FROM (
    SELECT lane, id FROM (
        SELECT lane, id, pg_catalog.row_number() OVER (PARTITION BY lane ORDER BY id) AS r,
               pg_catalog.count(*) OVER (PARTITION BY lane) AS c
        FROM {outbox}
    ) AS x
    WHERE r = greatest(1, (c * %(sent)s)::int8)
) AS s
WHERE g.lane = s.lane AND %(sent)s > 0
"""


async def timed(conn: psycopg.AsyncConnection[Any], query: str, params: Any = None) -> float:
    started = time.perf_counter()
    cursor = await conn.execute(query, params)
    await cursor.fetchall()
    return (time.perf_counter() - started) * 1000


async def measure(store: StoreSettings, rounds: int) -> None:
    statements: list[tuple[str, Any]] = [
        (
            "dash_lane_map",
            {"lanes": store.lanes, "cap": PARKED_CAP, "top": 50, "stall_after": 30.0},
        ),
        ("dash_parked_totals", {"cap": PARKED_CAP}),
        ("dash_members", None),
        ("dash_pending_capped", {"cap": COUNT_CAP + 1}),
        (
            "dash_table_counters",
            {
                "schema": store.db_schema,
                "table": store.names.table("outbox"),
                "held": store.names.table("held"),
            },
        ),
        ("dash_unordered_head", None),
    ]
    pool = DashboardPool(store, max_size=2, timeout=30.0)
    await pool.open()
    try:
        await _measure_on(pool, store, statements, rounds)
    finally:
        await pool.close()


async def _measure_on(
    pool: DashboardPool, store: StoreSettings, statements: list[tuple[str, Any]], rounds: int
) -> None:
    queries = queries_for(store.names, store.storage)
    sampler = StoreSampler(store, pool)
    await sampler.sample()  # warm the cache
    totals = [await sampler.sample() * 1000 for _ in range(rounds)]
    print(
        f"snapshot: median {statistics.median(totals):,.0f} ms, "
        f"best {min(totals):,.0f} ms over {rounds} rounds (budget 200 ms)"
    )
    async with pool.connection() as conn:
        for name, params in statements:
            async with without_jit(conn, store):  # as the snapshot runs them
                times = [await timed(conn, queries[name], params) for _ in range(rounds)]
            print(f"  {name:<22} median {statistics.median(times):8,.1f} ms")
        started = time.perf_counter()
        listing = await parked_page(conn, store, ParkedFilter())
        page = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        second = await parked_page(
            conn, store, ParkedFilter(), as_of=listing.as_of, after=listing.next_after
        )
        following = (time.perf_counter() - started) * 1000
        print(
            f"parked keys: first page {page:,.1f} ms ({len(listing.keys)} of "
            f"{listing.matching}), next page {following:,.1f} ms ({len(second.keys)})"
        )
    refine = await sampler.refine()
    print(f"refinement (pending rows per lane, whole table): {refine * 1000:,.0f} ms")
    assert sampler.snapshot is not None
    print(
        f"payload: {len(sampler.snapshot.lane_map.states):,} bytes of lane states "
        f"({(len(sampler.snapshot.lane_map.states) + 2) // 3 * 4:,} base64 characters)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn")
    parser.add_argument("--lanes", type=int, default=65_536)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--parked", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--storage", choices=("delete", "partitioned"), default="delete")
    parser.add_argument("--sent", type=float, default=0.5, help="partitioned: share passed")
    arguments = parser.parse_args()
    print(f"dashboard snapshot: {machine()}")
    with postgres(arguments.dsn) as dsn, scratch_schema(dsn, "bench_dash") as name:
        print(server_version(dsn))
        store = store_settings(
            name="bench", dsn=dsn, schema=name, lanes=arguments.lanes, storage=arguments.storage
        )

        async def run() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await schema.apply(conn, store)
                started = time.perf_counter()
                params = {
                    "lanes": arguments.lanes,
                    "rows": arguments.rows,
                    "parked": arguments.parked,
                    "sent": arguments.sent,
                }
                partitioned = arguments.storage == "partitioned"
                for template in (FILL, PARK, *((PROGRESS,) if partitioned else ())):
                    statement = sql.SQL(template).format(
                        outbox=sql.Identifier(name, store.names.table("outbox")),
                        parked=sql.Identifier(name, store.names.table("parked")),
                        progress=sql.Identifier(name, store.names.table("progress")),
                    )
                    await conn.execute(statement, params)
                for table in ("outbox", "progress") if partitioned else ("outbox",):
                    await conn.execute(
                        sql.SQL("VACUUM ANALYZE {}").format(
                            sql.Identifier(name, store.names.table(table))
                        )
                    )
                print(
                    f"filled {arguments.rows:,} rows over {arguments.lanes:,} lanes and "
                    f"{arguments.parked:,} parked keys in {time.perf_counter() - started:,.1f} s"
                    + (f" ({arguments.sent:.0%} of each lane sent)" if partitioned else "")
                )
            await measure(store, arguments.rounds)

        asyncio.run(run())


if __name__ == "__main__":
    main()
