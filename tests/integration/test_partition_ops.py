"""What an operator sees of a partitioned store's partitions (docs/storage.md), on real
PostgreSQL: the table health's outbox line summed over the partitions, how far ahead of the
database clock they reach, the warning before they run out (in the health, and logged by the
worker leading the cleanup) and the metric."""

from __future__ import annotations

import asyncio
import logging
import warnings
from typing import Any

import psycopg
import pytest

from relayer.observability.metrics import WorkerMetrics
from relayer.operations.health import PARTITIONS_AHEAD_WARNING, StoreHealth, read_health
from relayer.settings import StoreSettings, WorkerSettings
from relayer.store import rotate
from relayer.store.partitions import PARTITIONS_AHEAD, list_partitions, uuid_at
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.observability.scraping import Scrape, scrape_until
from tests.integration.relay.helpers import write

SPAN = 60.0  # seconds: the stores below use partition_span = "1m"
AHEAD_METRIC = "relayer_partitions_ahead_seconds"


async def partitioned_store(dsn: str, **overrides: Any) -> StoreSettings:
    values: dict[str, Any] = {
        "storage": "partitioned",
        "partition_span": "1m",
        "transports": {"memory": {"type": "memory"}},
        "default_transport": "memory",
        **overrides,
    }
    store = make_store(dsn, **values)
    await apply_schema(store)
    return store


async def health_of(store: StoreSettings) -> StoreHealth:
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        return await read_health(conn, store)


async def cut_partitions_ahead(store: StoreSettings, spans: int) -> None:
    """Detach and drop every partition starting more than ``spans`` spans past the database
    clock: what is left when rotation has not run for a while."""
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        clock = await conn.execute("SELECT (extract(epoch FROM now()) * 1000)::int8")
        row = await clock.fetchone()
        assert row is not None
        limit = uuid_at(int(row[0]) + int(spans * SPAN * 1000))
        for partition in await list_partitions(conn, store):
            if partition.lower is not None and partition.lower >= limit:
                await conn.execute(
                    f"ALTER TABLE {store.table_prefix}outbox DETACH PARTITION {partition.name}"
                )
                await conn.execute(f"DROP TABLE {partition.name}")


def partition_warnings(health: StoreHealth) -> list[str]:
    return [warning for warning in health.warnings if "partitions ahead" in warning]


async def test_the_outbox_line_sums_its_partitions_and_says_how_far_they_reach(
    pg_dsn: str,
) -> None:
    store = await partitioned_store(pg_dsn)
    write(store, ["a", "b", "c"], per_key=20)
    health = await health_of(store)
    lines = {table.table: table for table in health.tables}
    outbox = lines.pop("orders_outbox")
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT count(*), sum(pg_total_relation_size(inhrelid)) FROM pg_inherits "
            "WHERE inhparent = 'orders_outbox'::regclass"
        ).fetchone()
    assert row is not None
    partitions, size = row
    assert outbox.partitions == partitions == PARTITIONS_AHEAD + 2  # the floor, now, ahead
    assert outbox.size_bytes == size > 0  # the outbox itself has no storage of its own
    assert {"orders_progress", "orders_held"} <= set(lines)
    assert all(table.partitions is None and table.size_bytes > 0 for table in lines.values())
    # Made up to PARTITIONS_AHEAD + 1 spans past the start of the current one.
    assert health.partitions_ahead_seconds is not None
    assert PARTITIONS_AHEAD * SPAN - 30 < health.partitions_ahead_seconds <= 11 * SPAN
    assert partition_warnings(health) == []

    plain = make_store(pg_dsn, table_prefix="plain_")  # delete mode: nothing of the kind
    await apply_schema(plain)
    health = await health_of(plain)
    assert health.partitions_ahead_seconds is None
    assert all(table.partitions is None for table in health.tables)
    assert next(t for t in health.tables if t.table == "plain_outbox").size_bytes > 0


async def test_the_health_warns_before_the_partitions_ahead_run_out(pg_dsn: str) -> None:
    store = await partitioned_store(pg_dsn)
    await cut_partitions_ahead(store, 2)
    health = await health_of(store)
    assert health.partitions_ahead_seconds is not None
    assert 1 * SPAN < health.partitions_ahead_seconds < PARTITIONS_AHEAD_WARNING * SPAN
    [warning] = partition_warnings(health)
    assert "no partition of relation" in warning
    assert "rotation_skipped" in warning and "stores.orders.admin_dsn" in warning
    assert "`relayer partitions rotate orders`" in warning

    rotation = await rotate(store)
    assert rotation.skipped is None and len(rotation.created) >= PARTITIONS_AHEAD - 3
    health = await health_of(store)
    assert partition_warnings(health) == []
    assert health.partitions_ahead_seconds is not None
    assert health.partitions_ahead_seconds > PARTITIONS_AHEAD * SPAN - 30


async def test_the_cleanup_leader_warns_rotates_and_exports_how_far_ahead(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="relayer.worker.maintenance")
    store = await partitioned_store(pg_dsn, cleanup_interval="0.2s", poll_interval="0.1s")
    await cut_partitions_ahead(store, 2)
    worker = Worker([store], settings=WorkerSettings(pool_size=2))
    metrics = WorkerMetrics(worker, interval=0.1)
    port = await metrics.serve("127.0.0.1", 0)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(worker.run(stop)), asyncio.create_task(metrics.run(stop))]

    def rotated(result: Scrape) -> bool:
        ahead = result.samples.get((AHEAD_METRIC, (("store", "orders"),)))
        return ahead is not None and ahead > PARTITIONS_AHEAD * SPAN - 30

    try:
        found = await asyncio.to_thread(scrape_until, port, rotated)
        assert found.value(AHEAD_METRIC, store="orders") <= 11 * SPAN
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    # The leader's first look read the health before its first rotation: one line saying
    # what to do.
    warned = [
        record
        for record in caplog.records
        if getattr(record, "action", None) == "health"
        and "`relayer partitions rotate orders`" in record.getMessage()
    ]
    assert warned, caplog.text
    assert all(record.levelno == logging.WARNING for record in warned)


async def test_the_dashboards_health_page_shows_the_partitions(pg_dsn: str) -> None:
    from relayer.dashboard import Access, create_app

    with warnings.catch_warnings():  # starlette's test client would rather have httpx2
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    store = await partitioned_store(pg_dsn)
    app = create_app([store], Access([], read_only=True, allowed_hosts={"testserver"}))

    def page() -> str:
        with TestClient(app) as client:
            response = client.get("/s/orders/health")
        assert response.status_code == 200
        return str(response.text)

    text = await asyncio.to_thread(page)
    assert f"orders_outbox: the sum over its {PARTITIONS_AHEAD + 2} partitions." in text
    assert "s ahead of the database clock" in text
