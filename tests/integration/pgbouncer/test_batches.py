"""Lane batches behind PgBouncer in transaction mode: the settings a batch runs with travel in
its own transaction (SET LOCAL), never as start-up options or a session SET, and no server
connection keeps them for the next client."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import psycopg
import pytest

from relayer.relay.batch import LaneRelay
from relayer.relay.results import Scan
from relayer.settings import StoreSettings
from relayer.store import StorePool, batch_settings
from relayer.transports.base import OutgoingMessage
from relayer.transports.routing import Routing
from tests.conftest import make_store
from tests.integration.pgbouncer.helpers import pooled
from tests.integration.relay.helpers import keys_in_lane, pending, write
from tests.pgbouncer import PgBouncer


class Peeking:
    """A transport that, while a batch is sending (its transaction open and idle), reads the
    batch transaction's settings on the batch's own connection."""

    name = "peek"
    pipelines_within_key = True

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.seen: list[tuple[str, ...]] = []

    async def start(self) -> None:
        return None

    async def ordered_by_key(self, destination: str) -> bool:
        return True

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        if not self.seen:
            self.seen.append(await current(self.conn))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    async def close(self) -> None:
        return None


async def current(conn: psycopg.AsyncConnection[Any]) -> tuple[str, ...]:
    cursor = await conn.execute(
        "SELECT current_setting('synchronous_commit'), current_setting('enable_bitmapscan'), "
        "current_setting('idle_in_transaction_session_timeout')"
    )
    row = await cursor.fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize("pooler", ["none", "transaction"])
async def test_a_batch_runs_with_its_settings_and_leaves_none_behind(
    store: StoreSettings, pgbouncer_strict: PgBouncer, pooler: str
) -> None:
    chosen = {
        "lease_duration": "8s",
        "transports": {"peek": {"type": "memory"}},  # the name rows refer to
        "default_transport": "peek",
    }
    if pooler == "none":
        relayed = make_store(store.require_dsn(), **chosen)
    else:
        relayed = pooled(store, pgbouncer_strict, **chosen)
    write(store, keys_in_lane(store, 3, 4), per_key=3)
    pool = StorePool(relayed, purpose="batch", max_size=1, settings=batch_settings(relayed))
    await pool.open()
    try:
        async with pool.connection() as conn:
            peek = Peeking(conn)
            relay = LaneRelay(relayed, Routing(relayed, {"peek": peek}), "member-a")
            [result] = await relay.send_lanes(conn, [3])
            after = await current(conn)
            await conn.rollback()
    finally:
        await pool.close()
    assert (result.scan, result.sent) == (Scan.SENT, 12) and pending(store) == 0
    # An 8 s lease: a batch ends within 4 s; its backend is ended past 6 s idle in it.
    assert peek.seen == [("off", "off", "6s")]
    if pooler == "transaction":  # the next transaction of the same client: defaults again
        # (the server's: the embedded PostgreSQL of a machine without one runs with
        # synchronous_commit off)
        async with await psycopg.AsyncConnection.connect(store.require_dsn()) as direct:
            defaults = await current(direct)
        assert defaults[1:] == ("on", "0")
        assert after == defaults
    else:  # start-up options: every transaction of the connection
        assert after == peek.seen[0]
