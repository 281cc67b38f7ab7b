"""Templates and discovery on real PostgreSQL: stores found in a file or a catalog query join
a running worker, leave it gracefully, and keep their weights and concurrency limits."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest

from relayer import Outbox, OutboxMessage
from relayer.dispatch import QueueControl
from relayer.fleet.discovery import Fleet
from relayer.settings import RelayerSettings, StoreSettings, TemplateSettings, WorkerSettings
from relayer.transports.base import OutgoingMessage
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema
from tests.integration.relay.helpers import write
from tests.integration.relay.test_workers import BrokerView


def template_of(pg_dsn: str, tmp_path: Path, **discovery: Any) -> TemplateSettings:
    settings = RelayerSettings(
        dsn=pg_dsn,
        templates={
            "tenants": {
                "lanes": 4,
                "lease_duration": "3s",
                "poll_interval": "0.1s",
                "table_prefix": "relayer_",
                "transports": {"memory": {"type": "memory"}},
                "default_transport": "memory",
                "discover_interval": "1h",  # the tests refresh by hand
                "discovery": discovery or {"file": str(tmp_path / "stores.json")},
            }
        },
    )
    return settings.template("tenants")


def write_rows(path: Path, *rows: dict[str, Any]) -> None:
    path.write_text(json.dumps(list(rows)))


async def prepared(template: TemplateSettings, *schemas: str) -> None:
    for schema in schemas:
        await apply_schema(template.model_copy(update={"db_schema": schema}))


@pytest.fixture
def broker() -> MemoryTransport:
    return MemoryTransport("memory")


async def start(
    template: TemplateSettings, broker: MemoryTransport, member: str
) -> tuple[Worker, Fleet, asyncio.Event, asyncio.Task[None]]:
    worker = Worker([], settings=WorkerSettings(pool_size=6), instance_id=member)
    fleet = Fleet(worker, [template], transports=lambda _: {"memory": BrokerView(broker)})
    stop = asyncio.Event()
    task = asyncio.create_task(fleet.run(stop))
    await asyncio.wait_for(worker.started.wait(), 10)
    await until(lambda: worker.readiness()[0])  # the source was read once
    return worker, fleet, stop, task


@pytest.fixture
async def running(
    pg_dsn: str, tmp_path: Path, broker: MemoryTransport
) -> AsyncIterator[tuple[TemplateSettings, Worker, Fleet]]:
    template = template_of(pg_dsn, tmp_path)
    write_rows(tmp_path / "stores.json")
    worker, fleet, stop, task = await start(template, broker, "worker-a")
    try:
        yield template, worker, fleet
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


def pending(store: StoreSettings) -> int:
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {store.db_schema}.{store.table_prefix}outbox"
        ).fetchone()
    assert row is not None
    return int(row[0])


def members(dsn: str, schema: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT owner FROM {schema}.relayer_leases WHERE lane IS NULL ORDER BY owner"
        ).fetchall()
    return [row[0] for row in rows]


def leased(dsn: str, schema: str) -> list[int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            f"SELECT lane FROM {schema}.relayer_leases WHERE lane IS NOT NULL "
            "AND owner IS NOT NULL AND expires_at > now()"
        ).fetchall()
    return sorted(row[0] for row in rows)


async def until(condition: Any, within: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


async def test_stores_listed_in_a_file_join_and_leave_a_running_worker(
    pg_dsn: str, tmp_path: Path, broker: MemoryTransport, running: Any
) -> None:
    template, worker, fleet = running
    await prepared(template, "acme", "globex")
    write_rows(tmp_path / "stores.json", {"name": "acme", "schema": "acme"})
    report = await fleet.refresh("tenants")
    assert report.read and report.joined == ["tenants.acme"]
    assert set(worker.stores) == {"tenants.acme"}
    acme = worker.stores["tenants.acme"].store
    assert (acme.db_schema, acme.lanes, acme.table_prefix) == ("acme", 4, "relayer_")
    write(acme, ["k1", "k2"], per_key=5)
    await until(lambda: pending(acme) == 0)

    write_rows(
        tmp_path / "stores.json",
        {"name": "acme", "schema": "acme"},
        {"name": "globex", "schema": "globex", "weight": 3},
        {"name": "initech", "schema": "initech"},  # its schema is not applied yet
    )
    report = await fleet.refresh("tenants")
    assert report.joined == ["tenants.globex"] and report.left == []
    assert report.skipped == ["tenants.initech"]  # tried again at the next refresh
    await prepared(template, "initech")
    report = await fleet.refresh("tenants")
    assert report.joined == ["tenants.initech"]
    write_rows(
        tmp_path / "stores.json",
        {"name": "acme", "schema": "acme"},
        {"name": "globex", "schema": "globex", "weight": 3},
    )
    assert (await fleet.refresh("tenants")).left == ["tenants.initech"]
    assert worker.weight("tenants.globex") == 3 and worker.weight("tenants.acme") == 1
    globex = worker.stores["tenants.globex"].store
    write(globex, ["k3"], per_key=3)
    await until(lambda: pending(globex) == 0)
    assert members(pg_dsn, "globex") == ["worker-a"]

    write_rows(tmp_path / "stores.json", {"name": "globex", "schema": "globex", "weight": 3})
    report = await fleet.refresh("tenants")
    assert report.left == ["tenants.acme"]
    assert set(worker.stores) == {"tenants.globex"}
    assert members(pg_dsn, "acme") == [] and leased(pg_dsn, "acme") == []
    # The store that stays is served as before, through the shared transport.
    write(globex, ["k4"], per_key=2)
    await until(lambda: pending(globex) == 0)
    bodies = [m.body for m in broker.received("events")]
    assert sorted(bodies) == sorted(
        [f"k{k}#{n}".encode() for k in (1, 2) for n in range(5)]
        + [f"k3#{n}".encode() for n in range(3)]
        + [f"k4#{n}".encode() for n in range(2)]
    )


async def test_a_catalog_query_sets_weights_and_limits_and_bad_rows_are_skipped(
    pg_dsn: str,
    tmp_path: Path,
    broker: MemoryTransport,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE tenants (id text, tenant_schema text, weight int, max_batches int)"
        )
        conn.execute(
            "INSERT INTO tenants VALUES ('acme', 'acme', 2, 3), ('bad', 'Bad-Schema', 1, NULL), "
            "('globex', 'globex', NULL, NULL)"
        )
    template = template_of(
        pg_dsn,
        tmp_path,
        query="SELECT id AS name, tenant_schema AS schema, weight, "
        "max_batches AS concurrency_limit FROM tenants ORDER BY id",
    )
    await prepared(template, "acme", "globex")
    caplog.set_level(logging.WARNING, logger="relayer.fleet.discovery")
    worker, fleet, stop, task = await start(template, broker, "worker-a")
    try:
        await until(lambda: len(worker.stores) == 2)  # the first refresh, at start
        again = await fleet.refresh("tenants")  # runs once the first one has ended
        assert again.read and again.joined == [] and again.found == 2
        assert worker.weight("tenants.acme") == 2 and worker.weight("tenants.globex") == 1
        lines = [r.getMessage() for r in caplog.records if "tenants.bad" in r.getMessage()]
        assert len(lines) == 1
        assert "stores.tenants.bad.schema: 'Bad-Schema' is invalid" in lines[0]
        assert "fix its row" in lines[0]
        acme = worker.stores["tenants.acme"].store
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
            states = await QueueControl(conn, acme.names).status(["tenants.acme"])
        assert [s.limit for s in states if s.queue == "tenants.acme"] == [3]

        # The catalog fails: the stores found last stay, with one warning saying what to do.
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE tenants RENAME TO tenants_old")
        caplog.clear()
        for _ in range(2):
            report = await fleet.refresh("tenants")
            assert not report.read
        assert set(worker.stores) == {"tenants.acme", "tenants.globex"}
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1, warnings
        assert "still serving the 2 store(s) found last" in warnings[0]
        assert "check that the catalog database is reachable" in warnings[0]
        assert worker.readiness() == (True, "ready")
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)


async def keep_writing(
    stores: Mapping[str, StoreSettings], stop: asyncio.Event, written: dict[str, list[Any]]
) -> None:
    """Rows for 8 keys per store, each body 'store|key#n', until ``stop``."""
    numbers: dict[tuple[str, str], int] = {}
    connections = {
        name: await psycopg.AsyncConnection.connect(store.require_dsn())
        for name, store in stores.items()
    }
    try:
        while not stop.is_set():
            for name, store in stores.items():
                messages = []
                for key in (f"key-{index}" for index in range(8)):
                    number = numbers.get((name, key), 0)
                    numbers[(name, key)] = number + 1
                    body = f"{name}|{key}#{number}".encode()
                    messages.append(OutboxMessage("events", body, key=key))
                conn = connections[name]
                written[name] += await Outbox(store).write_many_async(conn, messages)
                await conn.commit()
            await asyncio.sleep(0.03)
    finally:
        for conn in connections.values():
            await conn.close()


def in_order_per_key(received: list[OutgoingMessage]) -> bool:
    """Per store and key, the first delivery of each row comes in the order written."""
    seen: set[Any] = set()
    last: dict[str, int] = {}
    for message in received:
        if message.id in seen:
            continue
        seen.add(message.id)
        where, number = message.body.decode().rsplit("#", 1)
        if last.get(where, -1) >= int(number):
            return False
        last[where] = int(number)
    return True


async def test_two_workers_keep_every_row_and_its_order_while_stores_come_and_go(
    pg_dsn: str, tmp_path: Path, broker: MemoryTransport
) -> None:
    template = template_of(pg_dsn, tmp_path)
    await prepared(template, "a", "b", "c")
    stores = {name: template.model_copy(update={"db_schema": name}) for name in "abc"}
    source = tmp_path / "stores.json"
    write_rows(source, {"name": "a", "schema": "a"}, {"name": "b", "schema": "b"})
    first = await start(template, broker, "worker-1")
    second = await start(template, broker, "worker-2")
    fleets = [first[1], second[1]]

    async def refresh() -> None:
        await asyncio.gather(*(fleet.refresh("tenants") for fleet in fleets))

    stop_writing = asyncio.Event()
    written: dict[str, list[Any]] = {name: [] for name in stores}
    writer = asyncio.create_task(keep_writing(stores, stop_writing, written))
    try:
        await until(lambda: all(len(w.stores) == 2 for w in (first[0], second[0])))
        await asyncio.sleep(0.5)
        # c joins, with rows written before the workers knew of it.
        write_rows(
            source,
            {"name": "a", "schema": "a"},
            {"name": "b", "schema": "b"},
            {"name": "c", "schema": "c"},
        )
        await refresh()
        await asyncio.sleep(0.5)
        # b leaves while rows are written to it: they wait in its outbox.
        write_rows(source, {"name": "a", "schema": "a"}, {"name": "c", "schema": "c"})
        await refresh()
        for worker, *_ in (first, second):
            assert "tenants.b" not in worker.stores
        assert members(pg_dsn, "b") == [] and leased(pg_dsn, "b") == []
        assert members(pg_dsn, "c") == ["worker-1", "worker-2"]
        await asyncio.sleep(0.5)
        waiting = pending(stores["b"])
        assert waiting > 0
        # ... and comes back: what waited is sent.
        write_rows(
            source,
            {"name": "a", "schema": "a"},
            {"name": "b", "schema": "b"},
            {"name": "c", "schema": "c"},
        )
        await refresh()
        await asyncio.sleep(0.5)
    finally:
        stop_writing.set()
        await writer
    try:
        await until(lambda: sum(pending(store) for store in stores.values()) == 0, within=20)
    finally:
        for _, _, stop, _ in (first, second):
            stop.set()
        await asyncio.wait_for(asyncio.gather(first[3], second[3]), 15)
    received = broker.received("events")
    delivered = {message.id for message in received}
    for name, ids in written.items():
        assert ids and set(ids) <= delivered, f"store {name}: rows lost"
    assert in_order_per_key(received)
    for schema in "abc":
        assert members(pg_dsn, schema) == [] and leased(pg_dsn, schema) == []


async def test_a_row_without_a_name_is_skipped_with_one_warning_and_the_others_served(
    tmp_path: Path, running: Any, caplog: pytest.LogCaptureFixture
) -> None:
    template, worker, fleet = running
    await prepared(template, "good")
    write_rows(tmp_path / "stores.json", {"schema": "acme"}, {"name": "good", "schema": "good"})
    caplog.set_level(logging.WARNING, logger="relayer.fleet.discovery")
    report = await fleet.refresh("tenants")
    assert report.read and report.joined == ["tenants.good"]
    assert report.skipped == ["row 1.name"]
    assert set(worker.stores) == {"tenants.good"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "row 1.name: None is invalid: is required" in warnings[0]
    assert "fix its row" in warnings[0]
