"""Stores joining a worker together (issue 34, items 21 and 22): their schema checks and first
heartbeats run side by side on batch connections of their database, within
``worker.max_connections``, instead of taking turns on the one housekeeping connection; and
the discovery query's connection to the catalog counts in that budget."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from relayer.fleet.discovery import Fleet
from relayer.settings import RelayerSettings, TemplateSettings, WorkerSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema
from tests.integration.relay.test_workers import BrokerView

SCHEMAS = [f"t{number}" for number in range(6)]
# One database: 3 fixed connections (housekeeping, LISTEN, dispatcher) and 4 batch ones.
BUDGET = 7


def template_of(dsn: str, **discovery: Any) -> TemplateSettings:
    settings = RelayerSettings(
        dsn=dsn,
        templates={
            "tenants": {
                "lanes": 2,
                "lease_duration": "3s",
                "poll_interval": "0.2s",
                "table_prefix": "relayer_",
                "transports": {"memory": {"type": "memory"}},
                "default_transport": "memory",
                "discover_interval": "1h",  # refreshed by hand
                "discovery": discovery,
            }
        },
    )
    return settings.template("tenants")


def backends(dsn: str, where: str = "true") -> int:
    """The worker's connections to the test's database (relayer's application names)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE datname = "
                "pg_catalog.current_database() AND application_name LIKE 'relayer:%%' AND {}"
            ).format(sql.SQL(where))
        ).fetchone()
    assert row is not None
    return int(row[0])


async def until(condition: Callable[[], bool], within: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await asyncio.to_thread(condition):
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_stores_joining_together_check_their_schemas_side_by_side_within_the_budget(
    pg_dsn: str, tmp_path: Path
) -> None:
    template = template_of(pg_dsn, file=str(tmp_path / "stores.json"))
    for schema in SCHEMAS:
        await apply_schema(template.model_copy(update={"db_schema": schema}))
    (tmp_path / "stores.json").write_text(json.dumps([{"name": s, "schema": s} for s in SCHEMAS]))
    worker = Worker([], settings=WorkerSettings(max_connections=BUDGET), instance_id="w")
    broker = MemoryTransport("memory")
    fleet = Fleet(worker, [template], transports=lambda _: {"memory": BrokerView(broker)})
    stop = asyncio.Event()
    # Every store's metadata locked: each join waits on its first statement, so the joins
    # under way at once can be counted as backends waiting for a lock.
    blocker = await psycopg.AsyncConnection.connect(pg_dsn)
    for schema in SCHEMAS:
        await blocker.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(schema, "relayer_meta")
            )
        )
    task = asyncio.create_task(fleet.run(stop))
    try:
        # The 4 batch connections the budget leaves, each a join, and the housekeeping
        # connection (one join at a time there): they wait together, never one by one.
        waiting = "wait_event_type = 'Lock'"
        await until(lambda: backends(pg_dsn, waiting) >= 4)
        assert backends(pg_dsn) <= BUDGET
        await blocker.rollback()
        await until(lambda: len(worker.stores) == len(SCHEMAS))
        assert backends(pg_dsn) <= BUDGET
        assert worker.databases.budget.highest <= BUDGET
    finally:
        await blocker.close()
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_the_catalog_connection_counts_in_the_budget_during_a_refresh(
    pg_dsn: str,
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE catalog (name text)")
        conn.execute("INSERT INTO catalog VALUES ('t0'), ('t1')")
    template = template_of(pg_dsn, query="SELECT name, name AS schema FROM catalog")
    for schema in ("t0", "t1"):
        await apply_schema(template.model_copy(update={"db_schema": schema}))
    worker = Worker([], settings=WorkerSettings(max_connections=BUDGET), instance_id="w")
    broker = MemoryTransport("memory")
    fleet = Fleet(worker, [template], transports=lambda _: {"memory": BrokerView(broker)})
    assert worker.connections.fixed == 1  # the catalog, before any store joined
    stop = asyncio.Event()
    task = asyncio.create_task(fleet.run(stop))
    blocker = await psycopg.AsyncConnection.connect(pg_dsn)
    held = contextlib.AsyncExitStack()
    try:
        await until(lambda: len(worker.stores) == 2)
        assert worker.connections.slots == BUDGET - 4  # 3 fixed, 1 for the catalog
        # Every unit the budget has left taken by batch connections (as busy batches would),
        # and the catalog locked, so that a refresh's read stays open while it is counted.
        (database,) = worker.databases
        while database.pool.available():
            await held.enter_async_context(database.pool.connection())
        await blocker.execute("LOCK TABLE catalog IN ACCESS EXCLUSIVE MODE")
        refresh = asyncio.create_task(fleet.refresh("tenants"))
        catalog = "application_name LIKE 'relayer:discovery%%'"
        await until(
            lambda: bool(worker.databases.budget._reservations) or backends(pg_dsn, catalog) > 0
        )
        assert backends(pg_dsn) <= BUDGET
        await held.aclose()  # batches end: the read takes the unit one of them gives back
        await until(lambda: backends(pg_dsn, catalog) == 1)
        assert backends(pg_dsn) <= BUDGET
        await blocker.rollback()
        report = await asyncio.wait_for(refresh, 20)
        assert report.read and report.found == 2
        assert worker.databases.budget.highest <= BUDGET
        assert backends(pg_dsn, catalog) == 0
    finally:
        await held.aclose()
        await blocker.close()
        stop.set()
        await asyncio.wait_for(task, 15)
