"""Stores joining a worker together (issue 34, items 21 and 22): the stores of one database check
their schemas in batches (a few statements for all of them, not some twenty each), within
``worker.max_connections``, and a bad store is refused alone; and the discovery query's
connection to the catalog counts in that budget."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from relayer.fleet.discovery import Fleet
from relayer.settings import RelayerSettings, TemplateSettings, WorkerSettings
from relayer.store import joins
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema
from tests.integration.relay.test_workers import BrokerView

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


class Statements:
    """The statements relayer's connections execute (their text), counted client-side."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.texts: list[str] = []
        execute = psycopg.AsyncCursor.execute

        async def counted(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            name = cursor.connection.info.get_parameters().get("application_name", "")
            if name.startswith("relayer:"):
                text = query if isinstance(query, str) else query.as_string(cursor.connection)
                self.texts.append(text)
            return await execute(cursor, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted)

    def count(self, part: str) -> int:
        return sum(1 for text in self.texts if part in text)


def fleet_of(dsn: str, tmp_path: Path, schemas: list[str], budget: int = BUDGET) -> Fleet:
    template = template_of(dsn, file=str(tmp_path / "stores.json"))
    (tmp_path / "stores.json").write_text(json.dumps([{"name": s, "schema": s} for s in schemas]))
    worker = Worker([], settings=WorkerSettings(max_connections=budget), instance_id="w")
    broker = MemoryTransport("memory")
    return Fleet(worker, [template], transports=lambda _: {"memory": BrokerView(broker)})


async def test_stores_joining_together_check_their_schemas_in_a_batch_within_the_budget(
    pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schemas = [f"t{number}" for number in range(12)]
    fleet = fleet_of(pg_dsn, tmp_path, schemas)
    for schema in schemas:
        await apply_schema(fleet.templates["tenants"].model_copy(update={"db_schema": schema}))
    statements = Statements(monkeypatch)
    # A batch waits for locks as long as they are held (not LOCK_TIMEOUT), so that the joins
    # can be seen waiting together.
    monkeypatch.setattr(joins, "LOCK_TIMEOUT", "0")
    stop = asyncio.Event()
    # Every store's metadata locked: the first batch waits for it, the stores that ask after
    # it was sent queue for the next.
    blocker = await psycopg.AsyncConnection.connect(pg_dsn)
    for schema in schemas:
        await blocker.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(schema, "relayer_meta")
            )
        )
    worker = fleet.worker
    task = asyncio.create_task(fleet.run(stop))
    try:
        waiting = "wait_event_type = 'Lock'"
        await until(lambda: backends(pg_dsn, waiting) == 1)
        (database,) = worker.databases
        await until(lambda: database.joins.sending + database.joins.queued == len(schemas))
        assert backends(pg_dsn, waiting) == 1  # one statement for the batch, not one a store
        assert backends(pg_dsn) <= BUDGET
        await blocker.rollback()
        await until(lambda: len(worker.stores) == len(schemas))
        assert backends(pg_dsn) <= BUDGET
        assert worker.databases.budget.highest <= BUDGET
        # The stores' metadata and catalogs were read once per batch (one or two: the stores
        # that asked while the first waited went in the next), not once (or twice) per store
        # as when each store checked on its own; one more catalog read builds what the
        # migrations create, when this process has not built it yet.
        batches = database.joins.batches
        assert batches <= 2 and database.joins.checked == len(schemas)
        assert statements.count("lanes, schema_version FROM") == batches
        assert statements.count("checksum FROM") == batches
        assert statements.count("pg_catalog.pg_attribute") <= batches + 1
    finally:
        await blocker.close()
        stop.set()
        await asyncio.wait_for(task, 15)


async def test_a_bad_store_in_a_batch_is_refused_alone_and_the_others_join(
    pg_dsn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = ["g0", "g1", "g2"]
    bad = {
        "never": "no relayer tables in schema 'never'",
        "lanes": "configured lanes=2 but the store was created with lanes=4",
        "drifted": "its tables differ from schema version",
        "broken": 'column "lanes" does not exist',
        "partitioned": "was created for storage = 'partitioned'",
    }
    fleet = fleet_of(pg_dsn, tmp_path, good + list(bad))
    template = fleet.templates["tenants"]
    for schema in [*good, "drifted", "broken"]:
        await apply_schema(template.model_copy(update={"db_schema": schema}))
    await apply_schema(template.model_copy(update={"db_schema": "lanes", "lanes": 4}))
    # Its outbox was made for partitioned storage; the template says delete (the default).
    await apply_schema(
        template.model_copy(update={"db_schema": "partitioned", "storage": "partitioned"})
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA never")
        conn.execute("DROP INDEX drifted.relayer_parked_lane")
        # Its metadata cannot be read as the batch reads it: the batch's statement fails and
        # every store of the batch checks on its own.
        conn.execute("ALTER TABLE broken.relayer_meta DROP COLUMN lanes")
    caplog.set_level(logging.WARNING, logger="relayer.fleet.discovery")
    stop = asyncio.Event()
    worker = fleet.worker
    task = asyncio.create_task(fleet.run(stop))

    def refused() -> dict[str, str]:
        found = {}
        for record in caplog.records:
            for name in bad:
                if f"store tenants.{name} could not join" in record.getMessage():
                    found[name] = record.getMessage()
        return found

    try:
        await until(lambda: len(worker.stores) == len(good) and len(refused()) == len(bad))
        assert sorted(worker.stores) == [f"tenants.{name}" for name in good]
        for name, reason in refused().items():
            assert bad[name] in reason, reason
            assert all(f"tenants.{other}" not in reason for other in bad if other != name)
    finally:
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
