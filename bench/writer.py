"""Writer benchmark: the cost of one outbox row in a business transaction, and COPY throughput.

    python bench/writer.py [--dsn DSN] [--transactions 3000] [--batches 100]
    python bench/writer.py --cpu [--rows 5000] [--paths psycopg,async,sqlalchemy,django]
        [--notify after_commit|in_transaction|off] [--own-code]

Prints (1) a one-row business transaction alone, with an extra ``SELECT 1`` (the floor of any
extra statement in the transaction) and with one outbox row, interleaved in rounds so all see
the same machine state, and the overheads in percent; (2) write_many
rows/s in 1,000-row batches (one transaction per batch). With ``--cpu``: the client CPU a row
of ``Outbox.write`` on each path against a bare psycopg execute of the same row
(bench/writer_cpu.py).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import sql

from bench import writer_cpu
from bench.common import machine, postgres, scratch_schema, server_version
from relayer import Outbox, OutboxMessage
from relayer.operations import schema
from relayer.settings import StoreSettings, store_settings

BODY = b"x" * 200


def setup(dsn: str, schema_name: str, notify: str = "after_commit") -> StoreSettings:
    store = store_settings(
        name="bench", dsn=dsn, schema=schema_name, table_prefix="w_", lanes=64, notify=notify
    )

    async def apply() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await schema.apply(conn, store)

    asyncio.run(apply())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint PRIMARY KEY, customer text NOT NULL, "
                "amount int NOT NULL)"
            ).format(sql.Identifier(schema_name, "orders"))
        )
    return store


def business_transactions(
    dsn: str, store: StoreSettings, rounds: int, per_round: int
) -> dict[str, float]:
    """Median seconds per transaction: the business insert alone, with one more statement that
    does nothing (``SELECT 1``: the floor of any extra statement, one round trip), and with one
    outbox row. The three kinds take turns round by round so that each sees the same machine."""
    outbox = Outbox(store)
    insert = sql.SQL("INSERT INTO {} (id, customer, amount) VALUES (%s, %s, %s)").format(
        sql.Identifier(store.db_schema, "orders")
    )
    kinds = ("plain", "select 1", "outbox")
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    next_id = 0
    with psycopg.connect(dsn) as conn:
        for round_number in range(rounds):
            for shift in range(len(kinds)):
                kind = kinds[(round_number + shift) % len(kinds)]
                started = time.perf_counter()
                for _ in range(per_round):
                    next_id += 1
                    customer = f"customer-{next_id % 1000}"
                    conn.execute(insert, (next_id, customer, 100))
                    if kind == "outbox":
                        outbox.write(conn, destination="orders", body=BODY, key=customer)
                    elif kind == "select 1":
                        conn.execute("SELECT 1")
                    conn.commit()
                times[kind].append((time.perf_counter() - started) / per_round)
    return {kind: statistics.median(values) for kind, values in times.items()}


def copy_throughput(dsn: str, store: StoreSettings, batches: int, batch_size: int) -> float:
    """Rows/s of write_many + commit; the application's messages are built before timing."""
    outbox = Outbox(store)
    prepared = [
        [
            OutboxMessage("orders", BODY, key=f"customer-{(batch * batch_size + i) % 10_000}")
            for i in range(batch_size)
        ]
        for batch in range(batches)
    ]
    total = 0
    with psycopg.connect(dsn) as conn:
        outbox.write_many(conn, prepared[0][:1])  # the once-per-Outbox lane-count check
        conn.commit()
        started = time.perf_counter()
        for messages in prepared:
            total += len(outbox.write_many(conn, messages))
            conn.commit()
        return total / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--transactions", type=int, default=3000)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--cpu", action="store_true", help="client CPU a row, per path")
    parser.add_argument("--rows", type=int, default=5000, help="--cpu: rows a side and path")
    parser.add_argument("--paths", default=",".join(writer_cpu.PATHS), help="--cpu: which")
    parser.add_argument("--notify", default="after_commit", help="--cpu: the store's notify")
    parser.add_argument("--own-code", action="store_true", help="--cpu: the own code's table alone")
    arguments = parser.parse_args()
    with postgres(arguments.dsn) as dsn, scratch_schema(dsn) as schema_name:
        store = setup(dsn, schema_name, arguments.notify)
        print(f"machine: {machine()}; {server_version(dsn)}")
        if arguments.cpu:
            paths = arguments.paths.split(",")
            lines = writer_cpu.report(store, arguments.rows, paths, not arguments.own_code)
            print("\n".join(lines))
            return
        rounds = 20
        per_round = max(1, arguments.transactions // rounds)
        median = business_transactions(dsn, store, rounds, per_round)
        plain = median["plain"]

        def overhead(kind: str) -> str:
            return f"{median[kind] * 1e6:,.0f} us ({(median[kind] - plain) / plain * 100:+.1f}%)"

        print(
            f"one-row business transaction: {plain * 1e6:,.0f} us alone; with an extra "
            f"SELECT 1 {overhead('select 1')}; with one outbox row {overhead('outbox')} "
            "<- the outbox overhead"
        )
        rate = copy_throughput(dsn, store, arguments.batches, 1000)
        print(f"write_many: {rate:,.0f} rows/s in 1,000-row batches (200-byte bodies)")


if __name__ == "__main__":
    main()
