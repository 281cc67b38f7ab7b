"""``relayer status`` shows each live member's lanes while they are idle (no live lease)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import asdict

import psycopg

from relayer.cli.status_command import render
from relayer.operations.status import StoreStatus, read_status
from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store


async def status_of(store: StoreSettings) -> StoreStatus:
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        return await read_status(conn, store)


async def test_idle_members_own_their_shares(pg_dsn: str) -> None:
    store = make_store(pg_dsn, lanes=8, lease_duration="3s", poll_interval="0.1s")
    await apply_schema(store)
    workers = [
        Worker(
            [store],
            transports={store.name: {"memory": MemoryTransport("memory")}},
            settings=WorkerSettings(pool_size=2),
            instance_id=name,
        )
        for name in ("member-a", "member-b")
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(worker.run(stop)) for worker in workers]
    try:
        async with asyncio.timeout(30):
            while True:
                status = await status_of(store)
                if len(status.members) == 2 and Counter(status.owners.values()) == {
                    "member-a": 4,
                    "member-b": 4,
                }:
                    break
                await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert status.leased == ()  # nothing to send: no lane was leased, yet every lane is owned
    assert status.owners == {lane: ("member-a", "member-b")[lane % 2] for lane in range(8)}
    text = render(status)
    assert "  member-a  lanes 4  " in text and "  member-b  lanes 4  " in text
    assert "lanes owned: 8 (0 leased now), not owned: 0" in text
    shown = json.loads(json.dumps(asdict(status), default=str))
    assert shown["owners"] == {str(lane): owner for lane, owner in status.owners.items()}
    after = await status_of(store)
    assert (after.members, after.owners) == ((), {})
