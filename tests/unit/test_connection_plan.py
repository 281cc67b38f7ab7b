"""Which stores share a worker's connections (relayer.store.databases), the bound a worker
plans for, and the turn-taking of a shared housekeeping connection (urgent uses first)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from relayer.errors import ConfigurationError
from relayer.settings import StoreSettings, WorkerSettings, store_settings
from relayer.store import Turns
from relayer.store.databases import database_key, plan_connections

DSN = "postgresql://app:s3cret@db.example:5432/shop"


def store(name: str, **values: Any) -> StoreSettings:
    return store_settings(**{"name": name, "dsn": DSN, "table_prefix": f"{name}_", **values})


def test_stores_in_other_schemas_and_prefixes_of_one_database_share() -> None:
    one = store("a")
    other = store("b", schema="side")
    spelled_otherwise = store(
        "c", dsn="host=db.example port=5432 dbname=shop user=app password=s3cret"
    )
    assert database_key(one) == database_key(other) == database_key(spelled_otherwise)
    assert "s3cret" not in repr(database_key(one))
    assert database_key(one).label == "app@db.example:5432/shop"


def test_another_database_or_other_start_up_settings_do_not_share() -> None:
    base = database_key(store("a"))
    assert database_key(store("b", dsn=DSN.replace("/shop", "/billing"))) != base
    # Without a pooler the batch connections' idle limit follows the lease at connect.
    assert database_key(store("c", lease_duration="60s")) != base
    pooled = [
        store(n, pooler="transaction", lease_duration=lease)
        for n, lease in (("d", "30s"), ("e", "60s"))
    ]
    assert database_key(pooled[0]) == database_key(pooled[1])  # each batch sets its own
    assert database_key(store("f", listen_dsn=DSN)) != base


def test_the_plan_counts_fixed_connections_per_database() -> None:
    stores = [store(f"s{n}") for n in range(100)] + [
        store(f"t{n}", dsn=DSN.replace("/shop", "/billing")) for n in range(100)
    ]
    plan = plan_connections(stores, WorkerSettings())
    assert (plan.databases, plan.fixed, plan.batch, plan.slots, plan.limit) == (2, 6, 20, 20, 26)
    assert not plan.configured
    assert "at most 26 connections" in plan.describe()
    tight = plan_connections(stores, WorkerSettings(max_connections=10))
    assert (tight.limit, tight.slots) == (10, 4)
    # Behind a transaction pooler without listen_dsn there is no LISTEN connection; a cluster
    # state given to the worker needs no dispatcher connection.
    polled = [store("p", pooler="transaction")]
    assert plan_connections(polled, WorkerSettings()).fixed == 2
    assert plan_connections(polled, WorkerSettings(), dispatcher=False).fixed == 1


def test_a_budget_without_room_names_the_field_the_value_and_the_rule() -> None:
    stores = [store("a"), store("b", dsn=DSN.replace("/shop", "/billing"))]
    with pytest.raises(ConfigurationError) as refused:
        plan_connections(stores, WorkerSettings(max_connections=7))
    assert refused.value.field == "worker.max_connections"
    assert refused.value.value == 7
    assert refused.value.rule.startswith("must be at least 8 for these stores")
    assert plan_connections(stores, WorkerSettings(max_connections=8)).slots == 2


def test_discovery_catalog_connections_are_part_of_the_plan() -> None:
    stores = [store("a")]
    plan = plan_connections(stores, WorkerSettings(max_connections=20), outside=1)
    assert (plan.fixed, plan.batch, plan.slots) == (4, 16, 16)
    assert "3 for 1 database(s)" in plan.describe()
    assert "1 for discovery catalog reads" in plan.describe()
    with pytest.raises(ConfigurationError) as refused:
        plan_connections(stores, WorkerSettings(max_connections=4), outside=1)
    assert refused.value.rule.startswith("must be at least 5 for these stores")
    assert "plus 1 for discovery catalog reads" in refused.value.rule
    # Before any store: room for the catalog read and one batch connection.
    with pytest.raises(ConfigurationError):
        plan_connections([], WorkerSettings(max_connections=1), outside=1)
    assert plan_connections([], WorkerSettings(max_connections=2), outside=1).batch == 1


async def test_urgent_turns_go_before_waiting_ordinary_ones() -> None:
    turns = Turns()
    order: list[str] = []
    release = asyncio.Event()

    async def use(name: str, urgent: bool) -> None:
        async with turns.turn(urgent):
            order.append(name)
            if name == "first":
                await release.wait()

    first = asyncio.create_task(use("first", False))
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(use(f"probe-{n}", False)) for n in range(3)]
    cancelled = asyncio.create_task(use("probe-cancelled", False))
    await asyncio.sleep(0)
    heartbeat = asyncio.create_task(use("heartbeat", True))
    await asyncio.sleep(0)
    cancelled.cancel()
    release.set()
    await asyncio.gather(first, heartbeat, *waiting)
    assert cancelled.cancelled()
    assert order == ["first", "heartbeat", "probe-0", "probe-1", "probe-2"]
    async with asyncio.timeout(1), turns.turn():
        pass  # free again
