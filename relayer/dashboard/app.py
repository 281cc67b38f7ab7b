"""The dashboard's ASGI application: one sampler and one small pool per store, the pages
(routes.py), the live fragments and the event stream.

The stores given by name are open while the dashboard runs. A template's stores (hundreds,
perhaps) are listed on the Fleet page and opened on demand: the first request for one reads
its template's source, opens its pool and starts its sampler; at most ``OPEN_STORES`` of them
are open at once, the least recently viewed closed first, so the dashboard's connections stay
bounded however large the fleet.

Each view has live fragments (HTML rendered from the latest snapshot, cached per snapshot
version, so any number of viewers cost one rendering). A tab opens one event stream for its
view; the stream sends a fragment only when its HTML changed, plus a ``tick`` with the data's
age. The page itself is rendered with the same cached fragments, and its stream starts from
that version, so nothing is sent twice.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from psycopg_pool import AsyncConnectionPool
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from relayer import __version__
from relayer.connection import connection_kwargs
from relayer.dashboard import reads
from relayer.dashboard.actions import BulkRuns
from relayer.dashboard.format import FILTERS
from relayer.dashboard.lanes import STATE_NAMES
from relayer.dashboard.sampler import Snapshot, StoreSampler
from relayer.dashboard.security import Access, SecurityHeaders, Viewer
from relayer.fleet.sources import DiscoveryError
from relayer.fleet.templates import TemplateSettings
from relayer.settings import StoreSettings
from relayer.status import StoreSummary, TemplateListing, list_template, read_summaries

logger = logging.getLogger(__name__)

HEALTH_TTL = 10.0  # seconds a table-health reading is reused
STREAM_TIMEOUT = 15.0  # a stream with no new snapshot re-checks its client this often
POOL_TIMEOUT = 3.0  # seconds a request waits for a connection before it reports the store down
POOL_SIZE = 4  # connections a store's pool may open (its sampler holds one at most)
# Template stores open at once (each a pool of 1 to POOL_SIZE connections and a sampler);
# opening one more closes the least recently viewed (docs/dashboard.md#fleet).
OPEN_STORES = 8
FIRST_SNAPSHOT_WAIT = 2.0  # seconds the request that opens a store waits for its first snapshot
VIEWS = ("overview", "lanes", "parked", "queues", "health", "audit")


@dataclass(slots=True)
class StoreContext:
    """One store of the dashboard: its settings, pool, sampler and rendered fragments."""

    store: StoreSettings
    pool: AsyncConnectionPool[Any]
    sampler: StoreSampler
    fragments: dict[tuple[str, bool], tuple[int, dict[str, str]]] = field(default_factory=dict)
    render_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    health: tuple[float, reads.HealthView] | None = None
    task: asyncio.Task[None] | None = None  # the sampler's, while open
    closed: bool = False

    @classmethod
    def create(
        cls, store: StoreSettings, *, interval: float, refine_interval: float
    ) -> StoreContext:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            store.require_dsn(),
            min_size=1,
            max_size=POOL_SIZE,
            open=False,
            timeout=POOL_TIMEOUT,
            kwargs=connection_kwargs(store, autocommit=True, name=f"{store.name}:dashboard"),
            name=f"relayer-dashboard-{store.name}",
        )
        sampler = StoreSampler(store, pool, interval=interval, refine_interval=refine_interval)
        return cls(store, pool, sampler)

    async def open(self) -> None:
        await self.pool.open(wait=False)
        self.task = asyncio.create_task(self.sampler.run(), name=f"dashboard-{self.store.name}")

    async def close(self) -> None:
        """Stop the sampler and close the pool (its streams say so and stay idle)."""
        self.closed = True
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        await self.sampler.closed()
        await self.pool.close()

    async def health_view(self) -> reads.HealthView:
        if self.health is None or time.monotonic() - self.health[0] > HEALTH_TTL:
            async with self.pool.connection() as conn:
                self.health = (time.monotonic(), await reads.health_view(conn, self.store))
        return self.health[1]


@dataclass(frozen=True, slots=True)
class FleetView:
    """The Fleet page's reading: when, each store's line (worst first) and the stores whose
    pages can be opened (a source's or a bad row's line has none)."""

    read_at: datetime
    summaries: list[StoreSummary]
    served: frozenset[str]


class Dashboard:
    """Everything the routes share."""

    def __init__(
        self,
        stores: Sequence[StoreSettings],
        access: Access,
        *,
        templates: Sequence[TemplateSettings] = (),
        interval: float = 2.0,
        refine_interval: float = 30.0,
        open_stores: int = OPEN_STORES,
    ) -> None:
        self.access = access
        self.interval = interval
        self.refine_interval = refine_interval
        self.templates_served = {template.name: template for template in templates}
        self.open_stores = open_stores
        # Every open store: the configured ones, then the template stores open now.
        self.contexts: dict[str, StoreContext] = {}
        for store in stores:
            self.contexts[store.name] = StoreContext.create(
                store, interval=interval, refine_interval=refine_interval
            )
        self.configured = tuple(self.contexts)
        self._on_demand: OrderedDict[str, None] = OrderedDict()  # least recently viewed first
        self._open_lock = asyncio.Lock()
        self._listings: dict[str, tuple[float, TemplateListing]] = {}
        self.bulk = BulkRuns()
        self.templates = Environment(
            loader=PackageLoader("relayer.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters.update(FILTERS)
        self._fleet: tuple[float, FleetView] | None = None
        self._fleet_lock = asyncio.Lock()

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        for name in self.configured:
            await self.contexts[name].open()

    async def stop(self) -> None:
        await self.bulk.close()
        for context in list(self.contexts.values()):
            await context.close()

    @property
    def has_fleet(self) -> bool:
        """Whether the Fleet page leads: more than one store, or a template's stores."""
        return len(self.configured) > 1 or bool(self.templates_served)

    @property
    def nav_stores(self) -> list[str]:
        """The stores the header lists: the configured ones, then the template stores open
        now by name (never a whole fleet)."""
        return [*self.configured, *sorted(self._on_demand)]

    @property
    def open_on_demand(self) -> list[str]:
        """The template stores open now, least recently viewed first."""
        return list(self._on_demand)

    async def fleet(self) -> FleetView:
        """Every store's ``status --all`` line, worst first: the configured stores and every
        store the templates' sources list now, read at most once per ``interval`` however many
        pages ask (on connections of their own, one per database: the fleet page must not
        wait behind a store's sampler)."""
        async with self._fleet_lock:
            if self._fleet is None or time.monotonic() - self._fleet[0] > self.interval:
                listings = await asyncio.gather(
                    *(self._read_listing(template) for template in self.templates_served.values())
                )
                await self._close_unlisted(listings)
                stores = [self.contexts[name].store for name in self.configured]
                stores += [store for listing in listings for store in listing.stores]
                problems = [problem for listing in listings for problem in listing.problems]
                summaries = sorted(
                    [*problems, *await read_summaries(stores)], key=lambda found: found.rank
                )
                view = FleetView(
                    datetime.now(UTC), summaries, frozenset(store.name for store in stores)
                )
                self._fleet = (time.monotonic(), view)
            return self._fleet[1]

    async def context(self, name: str) -> StoreContext | None:
        """Store ``name``'s context: a configured store, or a template store, opened now if
        it is not open (closing the least recently viewed one past ``open_stores``); None if
        neither this dashboard's stores nor its templates' sources name it. DiscoveryError
        when its template's source cannot be read."""
        context = self.contexts.get(name)
        if context is None:
            template = self.template_of(name)
            if template is None:
                return None
            async with self._open_lock:
                context = self.contexts.get(name)  # opened while this request waited
                if context is None:
                    context = await self._open(self.templates_served[template], name)
                    if context is None:
                        return None
            if context.sampler.snapshot is None:  # just opened: show its figures at once
                await context.sampler.wait_newer(0, FIRST_SNAPSHOT_WAIT)
        if name in self._on_demand:
            self._on_demand.move_to_end(name)
        return context

    def template_of(self, name: str) -> str | None:
        """The template whose stores ``name`` would be one of, if this dashboard serves it."""
        template = name.partition(".")[0]
        return template if "." in name and template in self.templates_served else None

    async def _open(self, template: TemplateSettings, name: str) -> StoreContext | None:
        listing = self._listings.get(template.name)
        if listing is None or time.monotonic() - listing[0] > self.interval:
            found = await self._read_listing(template)
        else:
            found = listing[1]
        if not found.readable:
            raise DiscoveryError(found.problems[0].error)
        store = next((store for store in found.stores if store.name == name), None)
        if store is None:
            return None
        while len(self._on_demand) >= self.open_stores and await self._close_least_recent():
            pass
        context = StoreContext.create(
            store, interval=self.interval, refine_interval=self.refine_interval
        )
        await context.open()
        self.contexts[name] = context
        self._on_demand[name] = None
        logger.info(
            "dashboard: opened store %s on demand (%d of at most %d template stores open)",
            name,
            len(self._on_demand),
            self.open_stores,
            extra={"action": "dashboard_store_open", "store": name},
        )
        return context

    async def _close_least_recent(self) -> bool:
        """Close the least recently viewed template store that runs no bulk change; False
        if each runs one (they stay open until it ends)."""
        busy = {run.store for run in self.bulk.runs.values() if not run.finished}
        name = next((name for name in self._on_demand if name not in busy), None)
        if name is None:
            return False
        await self._close(name, "to open another")
        return True

    async def _close(self, name: str, why: str) -> None:
        del self._on_demand[name]
        context = self.contexts.pop(name)
        await context.close()
        logger.info(
            "dashboard: closed store %s %s (at most %d template stores are open at once)",
            name,
            why,
            self.open_stores,
            extra={"action": "dashboard_store_close", "store": name},
        )

    async def _read_listing(self, template: TemplateSettings) -> TemplateListing:
        listing = await list_template(template)
        self._listings[template.name] = (time.monotonic(), listing)
        return listing

    async def _close_unlisted(self, listings: Sequence[TemplateListing]) -> None:
        """Close the open template stores that a source read just now no longer lists."""
        listed = {store.name for listing in listings for store in listing.stores}
        read = {listing.template for listing in listings if listing.readable}
        busy = {run.store for run in self.bulk.runs.values() if not run.finished}
        for name in list(self._on_demand):
            if self.template_of(name) in read and name not in listed and name not in busy:
                await self._close(name, "since its template's source no longer lists it")

    # -- rendering ------------------------------------------------------------------------

    def render(self, template: str, **values: Any) -> str:
        return self.templates.get_template(template).render(
            version=__version__, states=STATE_NAMES, **values
        )

    async def live_fragments(
        self, context: StoreContext, view: str, viewer: Viewer
    ) -> tuple[int, dict[str, str]]:
        """The view's live fragments for the latest snapshot (rendered once per version)."""
        snapshot = context.sampler.snapshot
        version = snapshot.version if snapshot else 0
        cache_key = (view, viewer.can_act)
        cached = context.fragments.get(cache_key)
        if cached is not None and cached[0] == version:
            return cached
        async with context.render_lock:
            cached = context.fragments.get(cache_key)
            if cached is not None and cached[0] == version:
                return cached
            rendered = await self._render_fragments(context, view, viewer, snapshot)
            context.fragments[cache_key] = (version, rendered)
            return version, rendered

    async def _render_fragments(
        self, context: StoreContext, view: str, viewer: Viewer, snapshot: Snapshot | None
    ) -> dict[str, str]:
        values: dict[str, Any] = {
            "store": context.store,
            "snapshot": snapshot,
            "sampler": context.sampler,
            "viewer": viewer,
        }
        names: dict[str, str] = {"banner": "_banner.html"}
        if view == "overview":
            names |= {"summary": "_summary.html", "members": "_members.html"}
            values["rates"] = json.dumps(context.sampler.rates.series())
            names["rates"] = "_rates.html"
        elif view == "lanes":
            names |= {
                "heat": "_heat.html",
                "heat-owners": "_heat_owners.html",
                "heat-pending": "_heat_pending.html",
                "top": "_top.html",
            }
            values |= heat_values(context, snapshot)
        elif view == "parked":
            async with context.pool.connection() as conn:
                values["groups"] = await reads.error_groups(conn, context.store)
            names["parked-summary"] = "_parked_summary.html"
        elif view == "queues":
            async with context.pool.connection() as conn:
                values["queues"] = await reads.queues_view(conn, context.store)
            names["queues"] = "_queues.html"
        elif view == "health":
            values["health"] = await context.health_view()
            names["health"] = "_health.html"
        return {name: self.render(template, **values) for name, template in names.items()}

    def tick(self, context: StoreContext, version: int) -> str:
        snapshot = context.sampler.snapshot
        refinement = context.sampler.refinement
        return json.dumps(
            {
                "version": version,
                "snapshot": int(snapshot.taken_at * 1000) if snapshot else None,
                "refined": int(refinement.taken_at * 1000) if refinement else None,
                "took_ms": round(snapshot.duration_ms, 1) if snapshot else None,
            }
        )

    # -- the event stream -----------------------------------------------------------------

    def stream(self, request: Request, context: StoreContext, view: str) -> EventSourceResponse:
        viewer = self.access.viewer(request)
        every = _number(request.query_params.get("every"), self.interval, 1.0, 60.0)
        since = int(_number(request.query_params.get("since"), -1, -1, 2**62))
        closed = {"store": context.store, "open_stores": self.open_stores}

        async def events() -> AsyncIterator[dict[str, str]]:
            sent: dict[str, bytes] = {}
            version = -1
            told_closed = False
            current = context.sampler.snapshot
            if current is not None and current.version == since:
                version, fragments = await self.live_fragments(context, view, viewer)
                sent = {name: _digest(html) for name, html in fragments.items()}
            while True:
                snapshot = await context.sampler.wait_newer(version, STREAM_TIMEOUT)
                if await request.is_disconnected():
                    return
                if context.closed:  # closed to open another: say so once, and stay idle (a
                    # stream that ended would be reopened by the browser, reopening the store)
                    if not told_closed:
                        told_closed = True
                        yield {"event": "banner", "data": self.render("_closed.html", **closed)}
                    await asyncio.sleep(STREAM_TIMEOUT)  # idle: only the disconnect check runs
                    continue
                if snapshot is None:
                    continue
                started = time.monotonic()
                version, fragments = await self.live_fragments(context, view, viewer)
                for name, html in fragments.items():
                    digest = _digest(html)
                    if sent.get(name) != digest:
                        sent[name] = digest
                        yield {"event": name, "data": html, "id": str(version)}
                yield {"event": "tick", "data": self.tick(context, version), "id": str(version)}
                await asyncio.sleep(max(every - (time.monotonic() - started), 0))

        return EventSourceResponse(events(), ping=10, send_timeout=10)


def heat_values(context: StoreContext, snapshot: Snapshot | None) -> dict[str, Any]:
    """The heat map's payload: one byte per lane per array, base64."""
    lanes = context.store.lanes
    refinement = context.sampler.refinement
    if snapshot is None:
        return {"heat_states": "", "heat_owner_bytes": "", "heat_owners": "[]", "heat_pending": ""}
    pending = refinement.pending_bytes if refinement else bytes(lanes)
    return {
        "heat_states": base64.b64encode(snapshot.lane_map.states).decode(),
        "heat_owner_bytes": base64.b64encode(snapshot.lane_map.owner_bytes).decode(),
        "heat_owners": json.dumps(list(snapshot.lane_map.owners)),
        "heat_pending": base64.b64encode(pending).decode(),
        "pending_by_lane": refinement.by_lane if refinement else {},
    }


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _number(text: str | None, default: float, low: float, high: float) -> float:
    try:
        value = float(text) if text is not None else default
    except ValueError:
        value = default
    return min(max(value, low), high)


def create_app(
    stores: Sequence[StoreSettings],
    access: Access,
    *,
    templates: Sequence[TemplateSettings] = (),
    interval: float = 2.0,
    refine_interval: float = 30.0,
    open_stores: int = OPEN_STORES,
) -> Starlette:
    """The dashboard for ``stores`` and the stores ``templates``' sources list: the samplers
    of ``stores`` start with the application's lifespan, a template store's when it is first
    viewed (at most ``open_stores`` of those at once)."""
    from relayer.dashboard.routes import routes

    dashboard = Dashboard(
        stores,
        access,
        templates=templates,
        interval=interval,
        refine_interval=refine_interval,
        open_stores=open_stores,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await dashboard.start()
        try:
            yield
        finally:
            await dashboard.stop()

    app = Starlette(
        routes=[
            *routes(dashboard),
            Mount(
                "/static",
                StaticFiles(packages=[("relayer.dashboard", "static")]),
                name="static",
            ),
        ],
        lifespan=lifespan,
    )
    app.state.dashboard = dashboard
    app.add_middleware(SecurityHeaders)
    return app


Handler = Callable[[Request], Awaitable[Response]]
__all__ = ["Dashboard", "FleetView", "Handler", "Route", "StoreContext", "create_app"]
