"""Unordered rows through PgBouncer in transaction mode: the application's after-commit
dispatch and the workers' recovery claim, send and settle them in transactions that set their
own idle limit (SET LOCAL), many times over on shared server connections."""

from __future__ import annotations

import psycopg

from relayer import Outbox, OutboxMessage
from relayer.transports.memory import MemoryTransport
from relayer.writer.after_commit import UnorderedDispatcher
from tests.integration.pgbouncer.helpers import pooled
from tests.integration.relay.helpers import pending
from tests.integration.unordered.helpers import backdate, memory_store, run_worker_until
from tests.pgbouncer import PgBouncer

ROUNDS = 10


async def test_after_commit_dispatch_through_pgbouncer(
    pg_dsn: str, pgbouncer_strict: PgBouncer
) -> None:
    direct = await memory_store(pg_dsn)
    store = pooled(
        direct,
        pgbouncer_strict,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    memory = MemoryTransport("memory")
    await memory.start()
    outbox, sent = Outbox(store), set()
    async with (
        UnorderedDispatcher(outbox, {"memory": memory}) as dispatcher,
        await psycopg.AsyncConnection.connect(store.require_dsn()) as conn,
    ):
        for round_number in range(ROUNDS):
            sent |= set(
                await outbox.write_many_async(
                    conn,
                    [OutboxMessage("emails", f"{round_number}.{n}".encode()) for n in "ab"],
                )
            )
            await conn.commit()
            result = await dispatcher.dispatch_after_commit(conn)
            assert (result.sent, result.error) == (2, "")
    assert {message.id for message in memory.received("emails")} == sent
    assert pending(direct) == 0


async def test_workers_recover_unordered_rows_through_pgbouncer(
    pg_dsn: str, pgbouncer_strict: PgBouncer
) -> None:
    direct = await memory_store(pg_dsn, maintenance_interval="0.1s")
    store = pooled(
        direct,
        pgbouncer_strict,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
        maintenance_interval="0.1s",
    )
    outbox, written = Outbox(store), []
    with psycopg.connect(store.require_dsn()) as conn:
        for round_number in range(ROUNDS):  # an application that never dispatched them
            written += outbox.write_many(
                conn, [OutboxMessage("emails", f"{round_number}".encode())] * 3
            )
            conn.commit()
    backdate(direct, written)
    worker = await run_worker_until(store, lambda: pending(direct) == 0)
    stats = worker.stores[store.name].relay.stats
    assert (stats.rollbacks, stats.last_error) == (0, "")
