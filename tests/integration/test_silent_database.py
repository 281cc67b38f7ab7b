"""Hanging up on a PostgreSQL that stopped answering (relayer.store.severance), against a real
server behind a proxy that forwards nothing while the connection stays open (issue 34, items
16 and 17; tests/chaos/test_database_silence.py runs whole workers through the same fault).

Each wait is bounded by ``asyncio.wait_for(..., WAIT)``: without the fix these hang, and fail
at that deadline instead of hanging the suite."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psycopg
import pytest

from relayer.errors import DatabaseSilentError, StoreError
from relayer.settings import StoreSettings
from relayer.store.connections import Session
from relayer.store.driver import connect
from relayer.store.severance import Severance
from tests.chaos.harness import upstream_of, via_proxy
from tests.chaos.proxy import LoopThread, Proxy
from tests.conftest import make_store

WAIT = 30.0  # a generous deadline: each of these ends within a second or two


@pytest.fixture
def proxied(pg_dsn: str) -> Iterator[tuple[LoopThread, Proxy, StoreSettings]]:
    """(the proxy's loop, the proxy, a store whose DSN goes through it)."""
    loop = LoopThread()
    proxy = loop.call(lambda: Proxy(upstream_of(pg_dsn), protocol="postgres"))
    port = loop.run(proxy.listen())
    try:
        yield loop, proxy, make_store(via_proxy(pg_dsn, port), lease_duration="6s")
    finally:
        loop.run(proxy.close())
        loop.close()


async def test_a_use_unanswered_within_its_bound_is_silent_and_the_next_reconnects(
    proxied: tuple[LoopThread, Proxy, StoreSettings],
) -> None:
    loop, proxy, store = proxied
    session = Session(store)

    async def select_one(within: float | None) -> None:
        async with session.connection("heartbeat", urgent=True, within=within) as conn:
            await conn.execute("SELECT 1")

    await asyncio.wait_for(select_one(None), WAIT)
    loop.call(proxy.stall)
    with pytest.raises(DatabaseSilentError, match="answered nothing within 1 s"):
        await asyncio.wait_for(select_one(1.0), WAIT)
    # Silent while connecting again too (the proxy accepts, then forwards nothing).
    with pytest.raises(DatabaseSilentError):
        await asyncio.wait_for(select_one(1.0), WAIT)
    loop.call(proxy.resume)
    await asyncio.wait_for(select_one(5.0), WAIT)
    await session.close()


async def test_a_cut_ends_a_statement_waiting_for_a_silent_server_at_once(
    proxied: tuple[LoopThread, Proxy, StoreSettings],
) -> None:
    loop, proxy, store = proxied
    severance = Severance(store, "test")
    conn = await severance.connect(lambda: connect(store), "test")
    loop.call(proxy.stall)
    statement = asyncio.ensure_future(conn.execute("SELECT 1"))
    await asyncio.sleep(0.1)  # sent, and waiting: nothing comes back
    assert not statement.done()
    severance.cut()
    with pytest.raises(psycopg.OperationalError):  # not psycopg's cancellation, 10 s long
        await asyncio.wait_for(statement, WAIT)
    assert conn.broken or conn.closed
    await conn.close()


async def test_a_cut_abandons_a_connection_being_made_and_refuses_new_ones(
    proxied: tuple[LoopThread, Proxy, StoreSettings],
) -> None:
    loop, proxy, store = proxied
    severance = Severance(store, "test")
    loop.call(proxy.stall)
    connecting = asyncio.ensure_future(severance.connect(lambda: connect(store), "connecting"))
    while not loop.call(lambda: len(proxy.links)):  # until the attempt reached the proxy
        await asyncio.sleep(0.02)
    severance.cut()
    with pytest.raises(StoreError, match="stopped waiting for PostgreSQL"):
        await asyncio.wait_for(connecting, WAIT)
    with pytest.raises(StoreError, match="stopped waiting for PostgreSQL"):
        await severance.connect(lambda: connect(store), "after the cut")
