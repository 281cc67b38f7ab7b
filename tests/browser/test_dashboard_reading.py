"""What the dashboard's pages say, read in a real browser (issue 34, item 19): a fresh
dashboard's chart says it has no data yet; the live-refresh button cannot be read as pausing
the queue; a small heat map has bordered, numbered cells; the by-error table cuts long errors
at a word, with the whole text in its title; a key that waits for an operator shows its
attempts without another configuration's max_attempts; a high share of dead rows is explained
beside it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
from playwright.async_api import expect

from relayer.dashboard import Access, create_app
from relayer.settings import StoreSettings
from tests.browser.conftest import Console, Served
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import park, write

WAIT = 10_000  # ms
LONG_ERROR = (
    "broker refused the message: the schema registry rejected the payload because the field "
    "customer_identifier is required by version 7 of the contract while the producer sent "
    "version 6, which names it customerIdentifier; upgrade the producer or register a "
    "compatible schema before redriving these keys"
)


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    settings = make_store(pg_dsn, lanes=64, max_attempts=10)
    await apply_schema(settings)
    return settings


async def test_what_the_pages_say(browser: Any, store: StoreSettings) -> None:
    park(store, "order-long", error=LONG_ERROR)
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute(f"UPDATE {store.table_prefix}parked SET attempts = 2")
    served = Served()
    app = create_app([store], Access([], read_only=True, allowed_hosts=served.hosts))
    async with served.serving(app):
        page = await browser.new_page(viewport={"width": 1400, "height": 900})
        console = Console(page)

        # A fresh dashboard: no data yet, said in words, not an empty strip.
        await page.goto(f"{served.url}/s/{store.name}/overview")
        points = await page.evaluate(
            "JSON.parse(document.querySelector('#rates .rates-data').dataset.series).t.length"
        )
        assert points < 2  # the dashboard started a moment ago
        await expect(page.locator("#rates-empty")).to_be_visible(timeout=WAIT)
        await expect(page.locator("#rates-chart")).to_be_hidden()
        assert "No data yet" in await page.inner_text("#rates-empty")

        # Live refresh: named for what it does.
        button = page.locator("#live-pause")
        assert await button.inner_text() == "Stop auto-refresh"
        assert "queues go on" in (await button.get_attribute("title") or "")
        await button.click()
        await expect(button).to_have_text("Resume auto-refresh")

        # 64 lanes: cells with borders and numbers.
        await page.goto(f"{served.url}/s/{store.name}/lanes")
        await page.wait_for_selector("#heatmap[data-lanes-drawn='64']", timeout=WAIT)
        heat = page.locator("#heatmap")
        assert int(await heat.get_attribute("data-cell") or "0") > 1
        assert await heat.get_attribute("data-numbered") == "yes"
        corner, inside = await page.evaluate(
            """() => {
                const c = document.getElementById('heatmap');
                const d = c.getContext('2d').getImageData(0, 0, 3, 3).data;  // one readback
                const at = (px, py) => Array.from(d.slice((py * 3 + px) * 4).slice(0, 3));
                return [at(0, 0), at(2, 2)];
            }"""
        )
        assert corner == [255, 255, 255]  # the border
        assert inside != corner  # the cell's colour

        # The by-error table: cut at a word, with the whole error in the title.
        await page.goto(f"{served.url}/s/{store.name}/parked")
        cell = page.locator("#parked-summary td.error-text").first
        shown = await cell.inner_text()
        assert shown.endswith("…"), shown
        kept = shown[:-1]
        assert LONG_ERROR.startswith(kept) and LONG_ERROR[len(kept)] in " ,;:.", shown
        assert await cell.get_attribute("title") == LONG_ERROR
        # Waiting for an operator: its attempts, without this dashboard's max_attempts.
        row = page.locator("#parked-table tr[data-key='order-long']")
        assert "/10" not in await row.inner_text()
        await page.goto(f"{served.url}/s/{store.name}/parked/key?key=order-long")
        assert "of 10" not in await page.inner_text("#attempts")

        # A high share of dead rows, too few to warn about: said so beside it.
        dead_rows(store, kept=2, deleted=98)
        outbox = f"{store.table_prefix}outbox"
        note = page.locator(f"tr[data-table='{outbox}'] .dead-note")
        deadline = time.monotonic() + 30
        while True:  # the server's statistics come within a second or so
            await page.goto(f"{served.url}/s/{store.name}/health")
            if "dead rows" in await note.inner_text() or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert "only" in await note.inner_text() and "10,000" in await note.inner_text()
        await page.close()
    assert console.errors == []


def dead_rows(store: StoreSettings, *, kept: int, deleted: int) -> None:
    """Leave ``deleted`` dead rows beside ``kept`` live ones in the outbox (autovacuum off for
    it, so that they stay)."""
    outbox = f"{store.table_prefix}outbox"
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {outbox} SET (autovacuum_enabled = false)")
        conn.execute(f"DELETE FROM {outbox}")
    write(store, [f"dead-{n}" for n in range(kept + deleted)])
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute(
            f"DELETE FROM {outbox} WHERE id IN "
            f"(SELECT id FROM {outbox} ORDER BY id LIMIT {deleted})"
        )
