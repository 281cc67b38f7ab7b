"""The dashboard in a real browser, against real PostgreSQL and a running worker.

A MemoryTransport fault parks a key; the operator redrives it from the page and its rows
arrive in order; a pause from the page stops the workers claiming; an action without the
token is refused; 65,536 lanes render (the time is printed, the payload cap asserted).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
from playwright.async_api import expect

from relayer.dashboard import Access, create_app, parse_token
from relayer.settings import StoreSettings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker
from tests.browser.conftest import Console, Served, screenshot
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import bodies_by_key, keys_in_lane, write

TOKEN = "alice:correct-horse-battery-staple"
POISON = "order-poison"
WAIT = 10_000  # ms a page may take to show a change (the acceptance: at most 2 s stale)


async def eventually(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(worker.started.wait(), 10)
        yield worker
    finally:
        stop.set()
        await task


def audit_rows(store: StoreSettings) -> list[tuple[Any, ...]]:
    with psycopg.connect(store.require_dsn()) as conn:
        return conn.execute(
            f"SELECT source, actor, action, ordering_key, outcome, reason, rows_affected "
            f"FROM {store.table_prefix}audit ORDER BY id"
        ).fetchall()


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    settings = make_store(
        pg_dsn,
        lanes=64,
        max_attempts=1,
        poll_interval="200ms",
        lease_duration="3s",
        default_transport="memory",
        transports={"memory": {"type": "memory"}},
    )
    await apply_schema(settings)
    return settings


async def test_operator_session(browser: Any, store: StoreSettings) -> None:
    broker = MemoryTransport("memory")
    broker.fail_key(POISON, retryable=False, message="broker refused: schema mismatch")
    worker = Worker([store], transports={store.name: {"memory": broker}}, instance_id="worker-a")
    served = Served()
    access = Access([parse_token("test", TOKEN)], read_only=False, allowed_hosts=served.hosts)
    app = create_app([store], access, interval=1.0, refine_interval=2.0)
    async with running(worker), served.serving(app):
        others = [f"customer-{n}" for n in range(40)]
        write(store, others, per_key=3)
        write(store, [POISON], per_key=3)
        await eventually(lambda: len(broker.received("events")) == 120)
        page = await browser.new_page(viewport={"width": 1400, "height": 900})
        console = Console(page)

        # Every page loads, live, with no console or CSP error.
        await page.goto(f"{served.url}/s/{store.name}/overview")
        await expect(page.locator("#stat-parked")).to_have_text("1", timeout=WAIT)
        await page.wait_for_selector("#members code", timeout=WAIT)
        assert "worker-a" in await page.inner_text("#members")
        assert await page.locator(".act").count() == 0  # not signed in: no buttons
        # The event stream changes a count without a reload.
        broker.fail_key("order-second", retryable=False, message="broker refused: too large")
        write(store, ["order-second"])
        await expect(page.locator("#stat-parked")).to_have_text("2", timeout=WAIT)
        await screenshot(page, "overview")

        await page.goto(f"{served.url}/s/{store.name}/lanes")
        await page.wait_for_selector("#heatmap[data-lanes-drawn='64']", timeout=WAIT)
        box = await page.locator("#heatmap").bounding_box()
        assert box is not None
        await page.mouse.move(box["x"] + 2, box["y"] + 2)
        assert (await page.inner_text("#heat-tip")).startswith("lane 0 ·")
        await page.mouse.click(box["x"] + 2, box["y"] + 2)
        await page.wait_for_selector("#lane-detail h3", timeout=WAIT)
        assert "Lane 0" in await page.inner_text("#lane-detail")
        await screenshot(page, "lanes")

        # Without signing in, a change is refused, even one forged from the page itself.
        refused = await page.request.post(
            f"{served.url}/s/{store.name}/queues/change",
            form={"action": "pause", "reason": "x"},
            headers={"Origin": served.url, "Sec-Fetch-Site": "same-origin"},
        )
        assert refused.status == 403

        await page.goto(f"{served.url}/login?next=/s/{store.name}/parked")
        await page.fill("#token", TOKEN.split(":", 1)[1])
        await page.click("#sign-in")
        await page.wait_for_selector("#parked-table", timeout=WAIT)
        assert await page.inner_text("#mode") == "alice"
        await screenshot(page, "parked")

        # Redrive the poison key from the page: its rows arrive in order.
        broker.clear_key(POISON)
        row = page.locator(f"tr[data-key='{POISON}']")
        await row.locator("button", has_text="Redrive").click()
        await page.wait_for_selector("#confirm-form", timeout=WAIT)
        assert "3" in await page.inner_text("#confirm-rows")
        await page.fill("#confirm-reason", "schema fixed")
        await screenshot(page, "redrive-dialog")
        await page.click("#confirm-submit")
        await page.wait_for_selector("#result.ok", timeout=WAIT)
        await eventually(lambda: bodies_by_key(broker.received("events")).get(POISON) == [0, 1, 2])
        assert (
            "dashboard",
            "alice",
            "redrive",
            POISON,
            "applied",
            "schema fixed",
            3,
        ) in audit_rows(store)

        await page.goto(f"{served.url}/s/{store.name}/parked/key?key=order-second")
        await page.wait_for_selector("#head-id")
        await page.locator("button", has_text="show").first.click()
        await page.wait_for_selector("pre.body", timeout=WAIT)
        assert "order-second#0" in await page.inner_text("pre.body")
        await screenshot(page, "key")

        # Pause from the page: the workers stop claiming; resume: the rows flow again.
        await page.goto(f"{served.url}/s/{store.name}/queues")
        await page.fill("#queue-reason", "broker maintenance")
        await page.click("#queue-pause")
        await page.wait_for_selector("#result.ok", timeout=WAIT)
        await expect(
            page.locator("#queue-table tr[data-queue='orders'] .queue-state")
        ).to_have_text("paused", timeout=WAIT)
        await screenshot(page, "queues")
        delivered = len(broker.received("events"))
        scans = worker.stores[store.name].relay.stats.scans
        late = keys_in_lane(store, 5, 3, prefix="late")
        write(store, late)
        await asyncio.sleep(2.0)  # ten poll intervals: a running worker would have sent them
        assert len(broker.received("events")) == delivered
        assert worker.stores[store.name].relay.stats.scans == scans
        await page.fill("#queue-reason", "maintenance over")
        await page.click("#queue-resume")
        await eventually(lambda: len(broker.received("events")) == delivered + 3)

        await page.goto(f"{served.url}/s/{store.name}/health")
        await page.wait_for_selector("#drift", timeout=WAIT)
        assert "No drift" in await page.inner_text("#drift")
        await screenshot(page, "health")
        await page.goto(f"{served.url}/s/{store.name}/audit")
        text = await page.inner_text("#audit-table")
        assert "schema fixed" in text and "broker maintenance" in text
        await screenshot(page, "audit")
        await page.close()
    assert console.errors == []


async def test_read_only_dashboard_shows_no_buttons_and_refuses_changes(
    browser: Any, store: StoreSettings
) -> None:
    write(store, ["order-1"])
    served = Served()
    app = create_app([store], Access([], read_only=False, allowed_hosts=served.hosts))
    async with served.serving(app):
        page = await browser.new_page()
        console = Console(page)
        for view in ("overview", "parked", "queues"):
            await page.goto(f"{served.url}/s/{store.name}/{view}")
            assert await page.inner_text("#mode") == "read-only"
            assert await page.locator("button.act").count() == 0
        response = await page.request.post(
            f"{served.url}/s/{store.name}/parked/change",
            form={"key": "order-1", "action": "drop"},
            headers={"Origin": served.url, "Sec-Fetch-Site": "same-origin"},
        )
        assert response.status == 403
        await page.close()
    assert console.errors == []


async def test_65536_lanes_render(browser: Any, pg_dsn: str) -> None:
    store = make_store(pg_dsn, lanes=65_536)
    await apply_schema(store)
    keys: dict[int, str] = {}
    number = 0
    from relayer import lane_for

    while len(keys) < 65_536:
        key = f"k{number}"
        keys.setdefault(lane_for(key, 65_536), key)
        number += 1
    write(store, keys.values())
    served = Served()
    app = create_app([store], Access([], read_only=True, allowed_hosts=served.hosts))
    async with served.serving(app):
        context = app.state.dashboard.contexts[store.name]
        await eventually(lambda: context.sampler.snapshot is not None, 30)
        snapshot = context.sampler.snapshot
        print(f"\nsnapshot of 65,536 busy lanes: {snapshot.duration_ms:,.0f} ms")
        page = await browser.new_page(viewport={"width": 1400, "height": 1000})
        console = Console(page)
        started = time.perf_counter()
        await page.goto(f"{served.url}/s/{store.name}/lanes")
        await page.wait_for_selector("#heatmap[data-lanes-drawn='65536']", timeout=WAIT)
        elapsed = time.perf_counter() - started
        drawn = float(await page.get_attribute("body", "data-heatmap-first-draw-ms") or "nan")
        payload = await page.get_attribute("#heat .heat-data", "data-b64") or ""
        print(
            f"65,536 lanes: page loaded and heat map drawn in {elapsed * 1000:,.0f} ms "
            f"(first draw at {drawn:,.0f} ms after navigation), state payload "
            f"{len(payload):,} characters"
        )
        assert len(payload) == 87_384  # one byte per lane, base64: the 90 KB cap
        assert await page.locator("#top tbody tr").count() == 50
        await screenshot(page, "lanes-65536")
        await page.close()
    assert console.errors == []
