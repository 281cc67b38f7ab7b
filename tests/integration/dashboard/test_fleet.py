"""The dashboard with templates (``relayer dashboard --template``), against real PostgreSQL
through Starlette's TestClient: the Fleet page lists every store the sources list, worst first;
a template store's pages open on demand, at most OPEN_STORES at once (the least recently viewed
closed: sampler stopped, pool closed); a store no source lists gets a one-line 400."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

from relayer.dashboard import Access, create_app
from relayer.dashboard.app import Dashboard
from relayer.dashboard.stores import OPEN_STORES
from relayer.settings import TemplateSettings, load_settings
from tests.conftest import apply_schema, make_store
from tests.integration.dashboard.test_app import HOST, SECRET, with_password
from tests.integration.relay.helpers import park

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def tenants(dsn: str, source: Path, *, name: str = "tenants") -> TemplateSettings:
    values: dict[str, Any] = {"lanes": 4, "discovery": {"file": str(source)}}
    return load_settings(dsn=dsn, templates={name: values}).template(name)


def rows(*names: str) -> str:
    return json.dumps([{"name": name, "table_prefix": f"{name}_"} for name in names])


async def applied(template: TemplateSettings, *names: str) -> None:
    from relayer.fleet.templates import DiscoveredRow, store_from_row

    for name in names:
        row = DiscoveredRow(name, table_prefix=f"{name}_", where="test")
        await apply_schema(store_from_row(template, row).settings)


def dashboard_of(client: TestClient) -> Dashboard:
    dashboard: Dashboard = client.app.state.dashboard  # type: ignore[attr-defined]
    return dashboard


@pytest.fixture
def read_only() -> Access:
    return Access([], read_only=True, allowed_hosts={HOST})


def nav_stores(page: str) -> list[str]:
    nav = re.search(r'<nav class="stores"[^>]*>(.*?)</nav>', page, re.S)
    assert nav, "a store's page has the store nav"
    return re.findall(r'<a href="/s/([^/"]+)/', nav[1])


async def test_the_fleet_page_lists_the_template_stores_worst_first(
    pg_dsn: str, tmp_path: Path, read_only: Access
) -> None:
    """Configured and template stores in one list, as ``status --all`` orders them: a source
    that cannot be read and a row that breaks a rule get a line of their own (no link), no
    password shows, and no template store opens (none is in the header's nav)."""
    source = tmp_path / "tenants.json"
    source.write_text(
        json.dumps(
            [
                {"name": "acme", "table_prefix": "acme_"},
                {"name": "globex", "table_prefix": "globex_"},
                {"name": "bad", "table_prefix": "bad_", "weight": 0},
            ]
        )
    )
    template = tenants(with_password(pg_dsn), source)
    missing = tenants(pg_dsn, tmp_path / "missing.json", name="partners")
    orders = make_store(pg_dsn)
    await apply_schema(orders)
    await applied(template, "acme", "globex")
    [globex] = [store for store in (await _listed(template)) if store.name == "tenants.globex"]
    park(globex, "stuck")
    app = create_app([orders], read_only, templates=[template, missing], interval=1)
    with TestClient(app) as client:
        home = client.get("/", follow_redirects=False)
        page = client.get("/fleet")
        overview = client.get("/s/orders/overview")
        opened = dashboard_of(client).stores.on_demand
    assert home.status_code == 303 and home.headers["location"] == "/fleet"
    assert page.status_code == 200
    listed = re.findall(r'<tr data-store="([^"]+)">', page.text)
    assert listed == ["partners.*", "tenants.?", "tenants.globex", "orders", "tenants.acme"]
    assert "its source cannot be read: discovery file" in page.text
    assert "a row is skipped: stores.tenants.bad.weight: 0 is invalid" in page.text
    links = re.findall(r'<a href="/s/([^/"]+)/overview">', page.text)
    assert links == ["tenants.globex", "orders", "tenants.acme"]
    assert SECRET not in page.text
    assert opened == []  # listing the fleet opens no store
    assert 'href="/fleet"' in overview.text
    assert nav_stores(overview.text) == ["orders"]


async def test_the_fleet_page_lists_each_row_a_worker_skips(
    pg_dsn: str, tmp_path: Path, read_only: Access
) -> None:
    """Rows a worker skips (no name, a name listed twice, another row's or a configured
    store's tables) each get a line of their own, not a store's."""
    source = tmp_path / "tenants.json"
    source.write_text(
        json.dumps(
            [
                {"name": "acme", "table_prefix": "acme_"},
                {"name": "acme", "table_prefix": "other_"},
                {"name": "twin", "table_prefix": "acme_"},
                {"name": "clash", "table_prefix": "orders_"},
                {"table_prefix": "nameless_"},
            ]
        )
    )
    template = tenants(pg_dsn, source)
    orders = make_store(pg_dsn)
    await apply_schema(orders)
    await applied(template, "acme")
    app = create_app([orders], read_only, templates=[template], interval=1)
    with TestClient(app) as client:
        page = client.get("/fleet")
    assert page.status_code == 200
    listed = re.findall(r'<tr data-store="([^"]+)">', page.text)
    assert sorted(listed) == [
        "orders",
        "tenants.?",
        "tenants.?",
        "tenants.?",
        "tenants.?",
        "tenants.acme",
    ]
    assert "is listed twice (row 2 and before)" in page.text
    assert page.text.count("uses the same database, schema and table prefix as store") == 2
    assert "row 5.name: None is invalid: is required" in page.text


async def _listed(template: TemplateSettings) -> list[Any]:
    from relayer.operations.status import list_template

    return list((await list_template(template)).stores)


async def test_template_stores_open_on_demand_and_the_ninth_closes_the_least_recently_viewed(
    pg_dsn: str, tmp_path: Path, read_only: Access
) -> None:
    names = [f"s{number}" for number in range(1, OPEN_STORES + 2)]
    source = tmp_path / "tenants.json"
    source.write_text(rows(*names))
    template = tenants(with_password(pg_dsn), source)
    await applied(template, *names)
    app = create_app([], read_only, templates=[template], interval=1)
    with TestClient(app) as client:
        dashboard = dashboard_of(client)
        first = client.get("/s/tenants.s1/overview")
        assert first.status_code == 200, first.text
        assert "Members" in first.text and "Taking the first snapshot" not in first.text
        for path in ("/s/tenants.s1/lanes", "/s/tenants.s1/lanes/3", "/s/tenants.s1/parked"):
            assert client.get(path).status_code == 200, path
        for name in names[1:OPEN_STORES]:
            assert client.get(f"/s/tenants.{name}/queues").status_code == 200, name
        assert dashboard.stores.on_demand == [f"tenants.{name}" for name in names[:OPEN_STORES]]
        client.get("/s/tenants.s1/health")  # s1 viewed again: s2 is now the least recent
        least_recent = dashboard.contexts["tenants.s2"]
        ninth = client.get(f"/s/tenants.{names[-1]}/overview")
        assert ninth.status_code == 200, ninth.text
        open_now = dashboard.stores.on_demand
        assert open_now == [f"tenants.{name}" for name in [*names[2:OPEN_STORES], "s1", names[-1]]]
        assert least_recent.closed and least_recent.pool.closed
        assert least_recent.task is not None and least_recent.task.done()
        assert all(not dashboard.contexts[name].pool.closed for name in open_now)
        assert set(dashboard.contexts) == set(open_now)
        # The header's nav: the open stores (no more) by name, the current one marked.
        assert nav_stores(ninth.text) == sorted(open_now)
        assert f'href="/s/tenants.{names[-1]}/overview" aria-current="page"' in ninth.text
        assert 'href="/fleet"' in ninth.text
        connected = _stores_connected(pg_dsn, until=lambda found: found <= set(open_now))
        assert connected <= set(open_now)
        assert SECRET not in ninth.text
        # Opening s2 again works, and closes the least recent in its turn (s3).
        assert client.get("/s/tenants.s2/overview").status_code == 200
        assert "tenants.s3" not in dashboard.stores.on_demand
        assert len(dashboard.stores.on_demand) == OPEN_STORES


def _stores_connected(dsn: str, *, until: Any) -> set[str]:
    """The stores with a dashboard connection in pg_stat_activity, once ``until`` holds for
    them (a closed pool's backends end a moment after it closed), or after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        with psycopg.connect(dsn, autocommit=True) as conn:
            found = {
                str(row[0]).removeprefix("relayer:").removesuffix(":dashboard")
                for row in conn.execute(
                    "SELECT application_name FROM pg_catalog.pg_stat_activity "
                    "WHERE application_name LIKE 'relayer:%:dashboard'"
                    " AND datname = pg_catalog.current_database()"
                )
            }
        if until(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


async def test_a_store_no_source_lists_gets_a_one_line_400(
    pg_dsn: str, tmp_path: Path, read_only: Access
) -> None:
    source, broken = tmp_path / "tenants.json", tmp_path / "broken.json"
    source.write_text(rows("acme"))
    broken.write_text("[not json")
    served = [tenants(pg_dsn, source), tenants(pg_dsn, broken, name="broken")]
    app = create_app([], read_only, templates=served, interval=1)
    with TestClient(app) as client:
        unlisted = client.get("/s/tenants.nope/overview")
        other = client.get("/s/partners.acme/overview")
        plain = client.get("/s/orders/lanes")
        unreadable = client.get("/s/broken.acme/overview")
        opened = dashboard_of(client).stores.on_demand
    assert unlisted.status_code == 400
    message = re.findall(r'id="message">([^<\n]+)</p>', unlisted.text)
    assert message == [
        "store: &#39;tenants.nope&#39; is not served by this dashboard: the source of template "
        "tenants does not list it"
    ]
    for response in (other, plain):
        assert response.status_code == 400
        assert re.search(
            r'id="message">store: [^<\n]+ is not served by this dashboard</p>', response.text
        )
    assert unreadable.status_code == 503
    assert "is not valid JSON" in unreadable.text
    assert opened == []


async def test_a_closed_store_tells_its_open_streams(
    pg_dsn: str, tmp_path: Path, read_only: Access
) -> None:
    """A tab still showing a store closed to open another is told so at once (its stream
    then stays idle instead of reopening the store); a store its source no longer lists is
    closed when the fleet is read again."""
    source = tmp_path / "tenants.json"
    source.write_text(rows("acme", "globex"))
    template = tenants(pg_dsn, source)
    await applied(template, "acme", "globex")
    app = create_app([], read_only, templates=[template], interval=1, open_stores=1)
    with TestClient(app) as client:
        with client.stream("GET", "/s/tenants.acme/events?view=overview") as stream:
            text = ""
            chunks = stream.iter_text()
            for chunk in chunks:
                text += chunk
                if "event: tick" in text:
                    break
            assert client.get("/s/tenants.globex/overview").status_code == 200
            for chunk in chunks:
                text += chunk
                if "was closed to open another" in text:
                    break
        dashboard = dashboard_of(client)
        opened = dashboard.stores.on_demand
        globex = dashboard.contexts["tenants.globex"]
        source.write_text(rows("acme"))
        fleet = client.get("/fleet")
        after = dashboard.stores.on_demand
        gone = client.get("/s/tenants.globex/overview")
    assert "tenants.acme was closed to open another template store" in text
    assert opened == ["tenants.globex"]
    assert re.findall(r'<tr data-store="([^"]+)">', fleet.text) == ["tenants.acme"]
    assert after == [] and globex.pool.closed
    assert gone.status_code == 400


async def test_a_template_store_given_by_name_is_listed_once_and_stays_open(
    pg_dsn: str, tmp_path: Path, read_only: Access
) -> None:
    """``relayer dashboard tenants.acme --template tenants``: the store named on the command
    line is open from the start, listed once, and never closed to open another."""
    source = tmp_path / "tenants.json"
    source.write_text(rows("acme", "globex"))
    template = tenants(pg_dsn, source)
    await applied(template, "acme", "globex")
    [acme] = [store for store in await _listed(template) if store.name == "tenants.acme"]
    app = create_app([acme], read_only, templates=[template], interval=1, open_stores=1)
    with TestClient(app) as client:
        fleet = client.get("/fleet")
        globex = client.get("/s/tenants.globex/overview")
        again = client.get("/s/tenants.acme/overview")
        dashboard = dashboard_of(client)
        opened, acme_open = dashboard.stores.on_demand, not dashboard.contexts[acme.name].closed
    listed = re.findall(r'<tr data-store="([^"]+)">', fleet.text)
    assert listed == ["tenants.acme", "tenants.globex"]
    assert globex.status_code == 200 and again.status_code == 200
    assert opened == ["tenants.globex"] and acme_open
    assert nav_stores(again.text) == ["tenants.acme", "tenants.globex"]
