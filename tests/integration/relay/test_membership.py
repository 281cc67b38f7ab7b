"""Membership on real PostgreSQL: heartbeats, expiry cleanup, release and leave."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from uuid import uuid4

import psycopg

from relayer.relay.membership import Membership
from relayer.settings import StoreSettings
from relayer.store import RelayStore
from tests.conftest import apply_schema, make_store


def connector(store: StoreSettings) -> Any:
    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True)

    return connect


def member_rows(store: StoreSettings) -> list[str]:
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute(
            "SELECT owner FROM orders_leases WHERE lane IS NULL ORDER BY owner"
        ).fetchall()
    return [row[0] for row in rows]


async def test_members_split_lanes_and_expired_members_are_removed(store: StoreSettings) -> None:
    first = Membership(store, "member-a", connector(store))
    second = Membership(store, "member-b", connector(store))
    await first.beat()
    await second.beat()
    await first.beat()
    assert first.members == second.members == ("member-a", "member-b")
    assert first.lanes | second.lanes == frozenset(range(store.lanes))
    assert not first.lanes & second.lanes
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute(
            "UPDATE orders_leases SET expires_at = now() - interval '1 second' "
            "WHERE name = 'member:member-b'"
        )
    await first.beat()  # b's heartbeat lapsed: a drops its row and takes every lane
    assert member_rows(store) == ["member-a"]
    assert first.lanes == frozenset(range(store.lanes))
    await first.leave()
    await second.leave()


async def a_holding_every_lane_then_b_joins(store: StoreSettings) -> tuple[Membership, Membership]:
    """member-a joins and holds every lane's lease; then member-b joins (a has not beaten yet)."""
    first = Membership(store, "member-a", connector(store))
    await first.beat()
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute(
            "UPDATE orders_leases SET owner = 'member-a', expires_at = now() + interval '1 minute' "
            "WHERE lane IS NOT NULL"
        )
    second = Membership(store, "member-b", connector(store))
    await second.beat()
    return first, second


async def test_lanes_outside_the_share_are_released_and_leave_releases_all(
    store: StoreSettings,
) -> None:
    first, second = await a_holding_every_lane_then_b_joins(store)
    await first.beat()  # now a's share is half: it releases the other half at once
    with psycopg.connect(store.require_dsn()) as conn:
        held = conn.execute(
            "SELECT lane FROM orders_leases WHERE lane IS NOT NULL AND owner = 'member-a' "
            "AND expires_at > now()"
        ).fetchall()
    assert {row[0] for row in held} == first.lanes
    await first.leave()
    with psycopg.connect(store.require_dsn()) as conn:
        left = conn.execute(
            "SELECT count(*) FROM orders_leases WHERE owner = 'member-a' AND expires_at > now()"
        ).fetchone()
    assert left == (0,)
    assert member_rows(store) == ["member-b"]
    assert first.lanes == frozenset()
    await second.leave()


def held_by(store: StoreSettings, member: str) -> set[int]:
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute(
            "SELECT lane FROM orders_leases WHERE lane IS NOT NULL AND owner = %s "
            "AND expires_at > now()",
            (member,),
        ).fetchall()
    return {row[0] for row in rows}


async def test_a_lane_held_by_a_batch_at_the_heartbeat_is_released_when_asked_after_it(
    store: StoreSettings,
) -> None:
    first, second = await a_holding_every_lane_then_b_joins(store)
    leaving = sorted(second.lanes)[0]
    with psycopg.connect(store.require_dsn()) as batch:  # a batch of a holds that lane's row
        batch.execute("SELECT 1 FROM orders_leases WHERE lane = %s FOR UPDATE", (leaving,))
        await first.beat()  # a learns its smaller share; the held lane is skipped
        assert held_by(store, "member-a") == first.lanes | {leaving}
    # The batch ended (the worker calls this after a batch that held lanes outside the share).
    await first.release_outside()
    assert held_by(store, "member-a") == first.lanes
    await first.leave()
    await second.leave()


def rows_scanned(plan: dict[str, Any], relation: str) -> int:
    """How many rows the scans of ``relation`` in an EXPLAIN ANALYZE plan read (returned or
    filtered out), over all their loops."""
    read = 0
    if plan.get("Relation Name") == relation and plan["Node Type"] != "ModifyTable":
        per_loop = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
        read += per_loop * plan.get("Actual Loops", 0)
    for child in plan.get("Plans", []):
        read += rows_scanned(child, relation)
    return read


async def test_a_lone_members_heartbeat_reads_no_lane_lease_row(pg_dsn: str) -> None:
    """A heartbeat finds the member rows through their own index (migration 0007), and a lone
    member, whose share is every lane, reads no lane's lease row to release lanes outside it:
    with 65,536 lanes each of those reads went through every lane's row."""
    store = make_store(pg_dsn, lanes=65_536)
    await apply_schema(store)
    db = RelayStore(store)
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        await db.prepare(conn)  # the lane rows
        # Every lane held by the member, as after a backlog over all of them.
        await conn.execute(
            "UPDATE orders_leases SET owner = 'member-a', expires_at = now() + interval '1 minute' "
            "WHERE lane IS NOT NULL"
        )
        await conn.execute("ANALYZE orders_leases")
        params = {"member": "member-a", "token": uuid4(), "lease": timedelta(seconds=30)}
        cursor = await conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + db.queries["heartbeat"], params
        )
        row = await cursor.fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    # Its own member row, renewed; before the index every read of the member rows and the
    # release went through all 65,536 lane rows.
    assert rows_scanned(plan, "orders_leases") < 10, json.dumps(plan, indent=1)
