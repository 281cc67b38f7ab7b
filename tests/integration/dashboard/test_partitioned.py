"""The dashboard over a partitioned store (storage = "partitioned", docs/storage.md) on real
PostgreSQL: its outbox keeps sent rows until their partition is dropped, so every count, list,
head and age the dashboard shows comes from the pending rows (held, and above each lane's
progress), and a parked key's head and rows are still shown once its partition is gone."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from uuid import UUID

import psycopg
import pytest
from starlette.testclient import TestClient

from relayer.dashboard import Access, create_app, parse_token
from relayer.dashboard.actions import change_key
from relayer.dashboard.lanes import PARKED, lane_map
from relayer.operations.parked import DROP, REDRIVE, Guard
from relayer.relay.batch import LaneRelay
from relayer.relay.results import Scan
from relayer.settings import StoreSettings
from relayer.store import rotate
from relayer.store.dashboard import DashboardPool, read_lane_counts, read_snapshot
from relayer.store.inspection import ParkedFilter, key_detail, parked_page, read_lane, row_body
from relayer.transports.memory import MemoryTransport
from relayer.transports.routing import Routing
from tests.integration.relay.helpers import keys_in_lane, pending, write
from tests.integration.test_partitioned_storage import (
    MEMBER,
    NOW,
    partitioned_store,
    partitions,
    send,
    write_old,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TOKEN = "ops:0123456789abcdef-token"


@dataclass(frozen=True, slots=True)
class Sent:
    """A partitioned store after its batches: what is pending, per lane and per key."""

    store: StoreSettings
    flowing: list[UUID]  # lane 1: the rows a batch left, in id order
    bad: str  # lane 2: the key parked (waiting for an operator) on its first row
    bad_rows: list[UUID]  # its rows, in id order, every one held
    later: list[UUID]  # lane 2: 25 rows of another key written after, above the progress
    sent_row: UUID  # a row of lane 3, sent (still in the outbox)


@pytest.fixture
async def memory() -> AsyncIterator[MemoryTransport]:
    transport = MemoryTransport("memory")
    await transport.start()
    yield transport
    await transport.close()


def ids_of(store: StoreSettings, keys: list[str]) -> list[UUID]:
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute(
            f"SELECT id FROM {store.table_prefix}outbox WHERE ordering_key = ANY(%s) ORDER BY id",
            (keys,),
        ).fetchall()
    return [row[0] for row in rows]


def outbox_rows(store: StoreSettings) -> int:
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(f"SELECT count(*) FROM {store.table_prefix}outbox").fetchone()
    assert row is not None
    return int(row[0])


async def drain(relay: LaneRelay, lane: int) -> None:
    while (await send(relay, lane)).scan is Scan.SENT:
        pass


@pytest.fixture
async def sent(pg_dsn: str, memory: MemoryTransport) -> Sent:
    """Lane 1: 60 rows, a batch of 50 sent; lane 2: a key parked on its first of 5 rows, a key
    sent, then 25 rows of it not sent yet; lane 3: every row sent. 40 rows pending, 97 in the
    outbox."""
    store = await partitioned_store(pg_dsn, max_attempts=1)
    relay = LaneRelay(store, Routing(store, {"memory": memory}), MEMBER)
    flowing_keys = keys_in_lane(store, 1, 2)
    write(store, flowing_keys, per_key=30)
    assert (await send(relay, 1)).sent == 50
    bad, good = keys_in_lane(store, 2, 2)
    write(store, [bad], per_key=5)
    write(store, [good], per_key=3)
    memory.fail_key(bad)
    await drain(relay, 2)
    later = write(store, [good], per_key=25)
    [done] = keys_in_lane(store, 3, 1)
    write(store, [done], per_key=4)
    await drain(relay, 3)
    assert pending(store) == 40 and outbox_rows(store) == 97
    flowing = ids_of(store, flowing_keys)[50:]
    return Sent(store, flowing, bad, ids_of(store, [bad]), later, ids_of(store, [done])[0])


async def test_the_snapshot_counts_and_maps_pending_rows_only(sent: Sent) -> None:
    store = sent.store
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        reading = await read_snapshot(conn, store, stall_after=60)
        counts = await read_lane_counts(conn, store, statement_timeout="10s")
    assert reading.pending == 40
    assert dict(counts) == {1: 10, 2: 30}
    lanes = lane_map(store.lanes, reading.lane_heads, [])
    busy = [lane for lane in range(store.lanes) if lanes.states[lane]]
    assert busy == [1, 2]  # lane 3 sent everything; its rows wait for their partition
    assert lanes.states[2] >> 5 == PARKED
    # The head ages come from the pending heads' ids (lane 1's head is its 51st row).
    assert [lane.lane for lane in lanes.oldest] == [1, 2]


async def test_a_lane_a_key_and_a_body_show_pending_rows_only(sent: Sent) -> None:
    store = sent.store
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        flowing = await read_lane(conn, store, 1)
        idle = await read_lane(conn, store, 3)
        parked = await read_lane(conn, store, 2)
        detail = await key_detail(conn, store, sent.bad)
        body = await row_body(conn, store, 1, sent.flowing[0])
        gone = await row_body(conn, store, 3, sent.sent_row)
        page = await parked_page(conn, store, ParkedFilter(destination="events"))
    assert [row.id for row in flowing.rows] == sent.flowing
    assert str(flowing.pending) == "10"
    assert (idle.rows, str(idle.pending)) == ((), "0")
    # Its held rows first (the head), then the rows above its progress: 20 shown.
    assert [row.id for row in parked.rows] == sent.bad_rows + sent.later[:15]
    assert str(parked.pending) == "30"
    assert [key.key for key in parked.parked] == [sent.bad]
    assert detail is not None
    assert [row.id for row in detail.rows] == sent.bad_rows and str(detail.pending) == "5"
    assert (detail.parked.destination, detail.parked.transport) == ("events", "memory")
    assert body is not None and body.text.endswith("#25")
    assert gone is None  # sent: gone for the dashboard, as in delete mode
    assert [key.key for key in page.keys] == [sent.bad] and str(page.matching) == "1"


async def test_a_parked_key_is_shown_once_its_partition_is_dropped(
    pg_dsn: str, memory: MemoryTransport
) -> None:
    store = await partitioned_store(pg_dsn, max_attempts=1)
    bad, good = keys_in_lane(store, 2, 2)
    write_old(store, [bad, good], per_key=5, minutes_ago=30)  # in the floor partition
    memory.fail_key(bad)
    relay = LaneRelay(store, Routing(store, {"memory": memory}), MEMBER)
    await drain(relay, 2)
    floor = (await partitions(store))[0]
    assert (await rotate(store, settle=NOW)).dropped == (floor.name,)
    [head, *_] = rows = ids_of_held(store)
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        page = await parked_page(conn, store, ParkedFilter(transport="memory"))
        detail = await key_detail(conn, store, bad)
        body = await row_body(conn, store, 2, head)
        reading = await read_snapshot(conn, store, stall_after=60)
    assert [(key.key, key.destination, key.transport) for key in page.keys] == [
        (bad, "events", "memory")
    ]
    assert detail is not None and [row.id for row in detail.rows] == rows
    assert (detail.parked.destination, detail.parked.transport) == ("events", "memory")
    assert body is not None and body.text == f"{bad}#0"
    assert reading.pending == 5


def ids_of_held(store: StoreSettings) -> list[UUID]:
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute(f"SELECT id FROM {store.table_prefix}held ORDER BY id").fetchall()
    return [row[0] for row in rows]


async def test_the_dashboards_redrive_and_drop_change_pending_rows(
    sent: Sent, memory: MemoryTransport
) -> None:
    store = sent.store
    pool = DashboardPool(store, max_size=1, timeout=5)
    await pool.open()
    try:
        guard = Guard(sent.bad_rows[0], 1)
        dropped = await change_key(
            pool, store, sent.bad, DROP, guard=guard, actor="ops", reason="x"
        )
        assert dropped.applied and dropped.rows == 5
        async with pool.connection() as conn:
            assert (await read_snapshot(conn, store, stall_after=60)).pending == 35
        # A key parked again, redriven: its held rows flow again.
        bad = keys_in_lane(store, 2, 1, prefix="again")[0]
        write(store, [bad], per_key=3)
        memory.fail_key(bad)
        relay = LaneRelay(store, Routing(store, {"memory": memory}), MEMBER)
        await drain(relay, 2)
        head = ids_of(store, [bad])[0]
        memory.clear_key(bad)
        redriven = await change_key(
            pool, store, bad, REDRIVE, guard=Guard(head, 1), actor="ops", reason="x"
        )
        assert redriven.applied and redriven.rows == 3
        await drain(relay, 2)
        async with pool.connection() as conn:
            assert await key_detail(conn, store, bad) is None
            assert (await read_snapshot(conn, store, stall_after=60)).pending == 10  # sent
    finally:
        await pool.close()


def test_the_pages_show_pending_rows(sent: Sent) -> None:
    store = sent.store
    access = Access([parse_token("test", TOKEN)], read_only=False, allowed_hosts={"testserver"})
    app = create_app([store], access, interval=1)
    with TestClient(app) as client:
        sampler = app.state.dashboard.contexts[store.name].sampler
        deadline = time.monotonic() + 10
        while sampler.snapshot is None and time.monotonic() < deadline:
            time.sleep(0.05)
        overview = client.get("/s/orders/overview")
        assert re.search(r'id="stat-pending">40<', overview.text), overview.text
        lane = client.get("/s/orders/lanes/3")
        assert str(sent.sent_row) not in lane.text
        key = client.get("/s/orders/parked/key", params={"key": sent.bad})
        assert key.status_code == 200
        assert all(str(row) in key.text for row in sent.bad_rows)
        confirm = client.get(
            "/s/orders/parked/confirm", params={"key": sent.bad, "action": "redrive"}
        )
        assert "Its 5 row(s) will be sent again" in confirm.text
        body = client.get("/s/orders/parked/body", params={"lane": 3, "id": str(sent.sent_row)})
        assert "The row is gone (sent or dropped)" in body.text
