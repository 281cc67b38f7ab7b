"""What every page of the dashboard shares (:class:`Dashboard`): the stores with one sampler
and one small pool each, the access rules, the templates, the Fleet view, the live fragments
and the event stream. The pages themselves are in pages.py, parked_pages.py and sessions.py;
app.py puts them together.

The stores it shows, configured or opened on demand from a template's source, are in
stores.py; the Fleet page lists them all, worst first.

Each view has live fragments (HTML rendered from the latest snapshot, cached per snapshot
version, so any number of viewers cost one rendering). A tab opens one event stream for its
view; the stream sends a fragment only when its HTML changed, plus a ``tick`` with the data's
age. The page itself is rendered with the same cached fragments, and its stream starts from
that version, so nothing is sent twice.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from relayer import __version__
from relayer.dashboard.actions import BulkRuns
from relayer.dashboard.format import FILTERS
from relayer.dashboard.lanes import STATE_NAMES
from relayer.dashboard.params import BadRequest, Refused
from relayer.dashboard.sampler import Snapshot
from relayer.dashboard.security import Access, Viewer
from relayer.dashboard.stores import OPEN_STORES, StoreContext, Stores
from relayer.dashboard.views import queues_view
from relayer.operations.status import StoreSummary, read_summaries
from relayer.settings import StoreSettings, TemplateSettings
from relayer.store.inspection import error_groups

STREAM_TIMEOUT = 15.0  # a stream with no new snapshot re-checks its client this often
VIEWS = ("overview", "lanes", "parked", "queues", "health", "audit")


@dataclass(frozen=True, slots=True)
class FleetView:
    """The Fleet page's reading: when, each store's line (worst first) and the stores whose
    pages can be opened (a source's or a bad row's line has none)."""

    read_at: datetime
    summaries: list[StoreSummary]
    served: frozenset[str]


class Dashboard:
    """Everything the pages share."""

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
        self.bulk = BulkRuns()
        self.stores = Stores(
            stores,
            templates,
            interval=interval,
            refine_interval=refine_interval,
            open_stores=open_stores,
            busy=self.bulk.running,
        )
        self.contexts = self.stores.contexts  # every open store, by name
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
        await self.stores.start()

    async def stop(self) -> None:
        await self.bulk.close()
        await self.stores.stop()

    @property
    def has_fleet(self) -> bool:
        """Whether the Fleet page leads: more than one store, or a template's stores."""
        return len(self.stores.configured) > 1 or bool(self.stores.templates)

    async def fleet(self) -> FleetView:
        """Every store's ``status --all`` line, worst first: the configured stores and every
        store the templates' sources list now, read at most once per ``interval`` however many
        pages ask (on connections of their own, one per database: the fleet page must not
        wait behind a store's sampler)."""
        async with self._fleet_lock:
            if self._fleet is None or time.monotonic() - self._fleet[0] > self.interval:
                listings = await self.stores.read_listings()
                stores = [self.contexts[name].store for name in self.stores.configured]
                shown = set(self.stores.configured)  # a configured TEMPLATE.NAME: listed once
                stores += [
                    store
                    for listing in listings
                    for store in listing.stores
                    if store.name not in shown
                ]
                problems = [problem for listing in listings for problem in listing.problems]
                summaries = sorted(
                    [*problems, *await read_summaries(stores)], key=lambda found: found.rank
                )
                view = FleetView(
                    datetime.now(UTC), summaries, frozenset(store.name for store in stores)
                )
                self._fleet = (time.monotonic(), view)
            return self._fleet[1]

    # -- rendering ------------------------------------------------------------------------

    def render(self, template: str, **values: Any) -> str:
        return self.templates.get_template(template).render(
            version=__version__, states=STATE_NAMES, **values
        )

    def html(
        self, template: str, request: Request, status: int = 200, **values: Any
    ) -> HTMLResponse:
        """``template`` rendered for ``request``'s viewer, with the header every page has."""
        body = self.render(template, **self._frame(request), **values)
        return HTMLResponse(body, status_code=status)

    def message(self, request: Request, status: int, text: str) -> HTMLResponse:
        """A one-line answer (an error, a refusal): a fragment for htmx, else a page."""
        template = "_message.html" if request.headers.get("hx-request") else "message.html"
        body = self.render(
            template, **self._frame(request), status=status, text=text, store=None, view=None
        )
        return HTMLResponse(body, status_code=status)

    def _frame(self, request: Request) -> dict[str, Any]:
        return {
            "request": request,
            "viewer": self.access.viewer(request),
            "access": self.access,
            "stores": self.stores.nav,
            "fleet_link": self.has_fleet,
            "interval": self.interval,
        }

    async def store_of(self, request: Request) -> StoreContext:
        """The store a request's path names (BadRequest if this dashboard does not serve it)."""
        name = request.path_params["store"]
        context = await self.stores.get(name)
        if context is None:
            template = self.stores.template_of(name)
            raise BadRequest(
                "store",
                name,
                "is not served by this dashboard"
                + (f": the source of template {template} does not list it" if template else ""),
            )
        return context

    def actor_of_change(self, request: Request) -> str:
        """Who makes the change ``request`` asks for (Refused, with the reason, if it may not)."""
        actor, refusal = self.access.actor_of_change(request)
        if actor is None:
            raise Refused(refusal)
        return actor

    async def page(self, request: Request, view: str, template: str, **values: Any) -> Response:
        """A store's page of ``view``, with the live fragments of its latest snapshot."""
        context = await self.store_of(request)
        viewer = self.access.viewer(request)
        version, fragments = await self.live_fragments(context, view, viewer)
        return self.html(
            template,
            request,
            view=view,
            store=context.store,
            sampler=context.sampler,
            snapshot=context.sampler.snapshot,
            live_version=version,
            fragments={name: Markup(text) for name, text in fragments.items()},
            **values,
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
                values["groups"] = await error_groups(conn, context.store)
            names["parked-summary"] = "_parked_summary.html"
        elif view == "queues":
            async with context.pool.connection() as conn:
                values["queues"] = await queues_view(conn, context.store)
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
        closed = {"store": context.store, "open_stores": self.stores.open_stores}

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
