"""Metrics of a worker that owns 65,536 backlogged lanes: a small scrape, rendered off the
event loop (/healthz answers and rows are relayed while a scrape is held mid-render), and an
exposition that promtool accepts."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from relayer import lane_for
from relayer.dispatch.control import QueueControl
from relayer.observability.metrics import DEFAULT_TOP_LANES, RENDER_THREAD, WorkerMetrics, exporter
from relayer.observability.metrics.snapshot import WorkerSnapshot
from relayer.settings import StoreSettings, WorkerSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.integration.observability.scraping import Scrape, parse, scrape_until
from tests.integration.relay.helpers import write
from tests.services import unavailable

LANES = 65_536
# The families relayer exports whatever the lane count: every one below is a few lines.
FEW_LINES = 400


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as response:
        return str(response.read().decode())


async def healthz(port: int) -> bytes:
    """GET /healthz from the test's own event loop, which is also the worker's."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


def promtool_check(text: str) -> None:
    """``promtool check metrics`` finds no problem (Debian's `prometheus` package has it)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        unavailable("promtool is not installed (apt-get install prometheus)")
        return
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def one_key_per_lane() -> Iterator[str]:
    seen: set[int] = set()
    number = 0
    while len(seen) < LANES:
        key = f"k{number}"
        lane = lane_for(key, LANES)
        if lane not in seen:
            seen.add(lane)
            yield key
        number += 1


@pytest.fixture
async def busy_store(pg_dsn: str) -> StoreSettings:
    """65,536 lanes, one row in each, the store's queue paused so they stay."""
    store = make_store(
        pg_dsn,
        lanes=LANES,
        poll_interval="0.2s",
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    await set_paused(store, True)
    await asyncio.to_thread(write, store, list(one_key_per_lane()))
    return store


async def set_paused(store: StoreSettings, paused: bool) -> None:
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        control = QueueControl(conn, store.names)
        await (control.pause if paused else control.resume)(store.name, by="scale test")


def every_lane_pending(result: Scrape) -> bool:
    return result.samples.get(("relayer_pending_lanes", (("store", "orders"),))) == LANES


async def test_a_scrape_of_65536_busy_lanes_is_small_and_rendered_off_the_event_loop(
    busy_store: StoreSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = MemoryTransport("memory")
    worker = Worker(
        [busy_store],
        transports={"orders": {"memory": broker}},
        settings=WorkerSettings(pool_size=4),
        instance_id="scale",
    )
    metrics = WorkerMetrics(worker, interval=0.5)
    port = await metrics.serve("127.0.0.1", 0)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(worker.run(stop)), asyncio.create_task(metrics.run(stop))]
    entered, release = threading.Event(), threading.Event()
    try:
        await asyncio.to_thread(scrape_until, port, every_lane_pending, 120)
        text = await asyncio.to_thread(metrics_text, port)
        result = parse(text)
        assert result.value("relayer_owned_lanes", store="orders") == LANES
        assert result.value("relayer_pending_rows", store="orders") == LANES
        detail = result.by_label("relayer_lane_pending_rows", "lane", store="orders")
        assert len(detail) == DEFAULT_TOP_LANES and set(detail.values()) == {1}
        assert len(text.splitlines()) < FEW_LINES  # every lane's series: 131,180 lines
        assert {"process_cpu_seconds_total", "python_info", "relayer_build_info"} <= (
            result.names()
        )
        promtool_check(text)

        # Hold a scrape inside its render: if it ran on the event loop, nothing below could
        # happen until the hold times out, and `released` would be False.
        seen: dict[str, Any] = {}
        render = exporter.worker_families

        def held(snapshot: WorkerSnapshot) -> Any:
            seen["thread"] = threading.current_thread().name
            entered.set()
            seen["released"] = release.wait(60)
            return render(snapshot)

        monkeypatch.setattr(exporter, "worker_families", held)
        scrape = asyncio.create_task(asyncio.to_thread(metrics_text, port))
        assert await asyncio.to_thread(entered.wait, 60)
        assert (await healthz(port)).startswith(b"HTTP/1.1 200 OK")
        await set_paused(busy_store, False)  # the relay goes on too: rows reach the broker
        async with asyncio.timeout(60):
            while not broker.received("events"):
                await asyncio.sleep(0.05)
        release.set()
        held_text = await scrape
        assert seen == {"thread": seen["thread"], "released": True}
        assert seen["thread"].startswith(RENDER_THREAD)
        assert "relayer_pending_rows" in held_text
    finally:
        release.set()
        stop.set()
        await asyncio.gather(*tasks)
