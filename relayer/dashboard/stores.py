"""The stores a dashboard shows: one pool and one sampler per open store.

The stores given by name are open while the dashboard runs. A template's stores (hundreds,
perhaps) are listed on the Fleet page and opened on demand: the first request for one looks it
up in its template's source, opens its pool and starts its sampler. At most ``OPEN_STORES`` of
them are open at once, the least recently viewed closed first (sampler stopped, pool closed),
so the dashboard's connections stay bounded however large the fleet (docs/dashboard.md#fleet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from relayer.dashboard.sampler import StoreSampler
from relayer.dashboard.views import HealthView, health_view
from relayer.fleet.sources import DiscoveryError
from relayer.fleet.templates import tables_of
from relayer.operations.status import TemplateListing, list_template
from relayer.settings import StoreSettings, TemplateSettings
from relayer.store.dashboard import DashboardPool

logger = logging.getLogger(__name__)

HEALTH_TTL = 10.0  # seconds a table-health reading is reused
POOL_TIMEOUT = 3.0  # seconds a request waits for a connection before it reports the store down
POOL_SIZE = 4  # connections a store's pool may open (its sampler holds one at most)
# Template stores open at once (each a pool of 1 to POOL_SIZE connections and a sampler);
# opening one more closes the least recently viewed (docs/dashboard.md#fleet).
OPEN_STORES = 8
FIRST_SNAPSHOT_WAIT = 2.0  # seconds the request that opens a store waits for its first snapshot


@dataclass(slots=True)
class StoreContext:
    """One store of the dashboard: its settings, pool, sampler and rendered fragments."""

    store: StoreSettings
    pool: DashboardPool
    sampler: StoreSampler
    fragments: dict[tuple[str, bool], tuple[int, dict[str, str]]] = field(default_factory=dict)
    render_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    health: tuple[float, HealthView] | None = None
    task: asyncio.Task[None] | None = None  # the sampler's, while open
    closed: bool = False

    @classmethod
    def create(
        cls, store: StoreSettings, *, interval: float, refine_interval: float
    ) -> StoreContext:
        pool = DashboardPool(store, max_size=POOL_SIZE, timeout=POOL_TIMEOUT)
        sampler = StoreSampler(store, pool, interval=interval, refine_interval=refine_interval)
        return cls(store, pool, sampler)

    async def open(self) -> None:
        await self.pool.open()
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

    async def health_view(self) -> HealthView:
        if self.health is None or time.monotonic() - self.health[0] > HEALTH_TTL:
            async with self.pool.connection() as conn:
                self.health = (time.monotonic(), await health_view(conn, self.store))
        return self.health[1]


class Stores:
    """The configured stores (open from ``start`` to ``stop``) and the template stores open
    now, at most ``open_stores`` of them; ``busy()`` names the stores a bulk change is running
    on (never closed under it)."""

    def __init__(
        self,
        stores: Sequence[StoreSettings],
        templates: Sequence[TemplateSettings],
        *,
        interval: float,
        refine_interval: float,
        open_stores: int,
        busy: Callable[[], set[str]],
    ) -> None:
        self.interval = interval
        self.refine_interval = refine_interval
        self.templates = {template.name: template for template in templates}
        self.open_stores = open_stores
        self._busy = busy
        # Every open store: the configured ones, then the template stores open now.
        self.contexts: dict[str, StoreContext] = {}
        for store in stores:
            self.contexts[store.name] = StoreContext.create(
                store, interval=interval, refine_interval=refine_interval
            )
        self.configured = tuple(self.contexts)
        # The configured stores' tables: a template's row using them is skipped, as by a worker.
        self._taken = {tables_of(store): store.name for store in stores}
        self._on_demand: OrderedDict[str, None] = OrderedDict()  # least recently viewed first
        self._open_lock = asyncio.Lock()
        self._listings: dict[str, tuple[float, TemplateListing]] = {}

    async def start(self) -> None:
        for name in self.configured:
            await self.contexts[name].open()

    async def stop(self) -> None:
        for context in list(self.contexts.values()):
            await context.close()

    @property
    def nav(self) -> list[str]:
        """The stores the header lists: the configured ones, then the template stores open
        now by name (never a whole fleet)."""
        return [*self.configured, *sorted(self._on_demand)]

    @property
    def on_demand(self) -> list[str]:
        """The template stores open now, least recently viewed first."""
        return list(self._on_demand)

    def template_of(self, name: str) -> str | None:
        """The template whose stores ``name`` would be one of, if this dashboard serves it."""
        template = name.partition(".")[0]
        return template if "." in name and template in self.templates else None

    async def get(self, name: str) -> StoreContext | None:
        """Store ``name``'s context: a configured store, or a template store, opened now if
        it is not open (closing the least recently viewed one past ``open_stores``); None if
        neither the configured stores nor a template's source name it. DiscoveryError when
        its template's source cannot be read."""
        context = self.contexts.get(name)
        if context is None:
            template = self.template_of(name)
            if template is None:
                return None
            async with self._open_lock:
                context = self.contexts.get(name)  # opened while this request waited
                if context is None:
                    context = await self._open(self.templates[template], name)
                    if context is None:
                        return None
            if context.sampler.snapshot is None:  # just opened: show its figures at once
                await context.sampler.wait_newer(0, FIRST_SNAPSHOT_WAIT)
        if name in self._on_demand:
            self._on_demand.move_to_end(name)
        return context

    async def read_listings(self) -> list[TemplateListing]:
        """Every template's source read now (at once); the open template stores that a
        source no longer lists are closed."""
        readings = (self._read(template) for template in self.templates.values())
        listings = await asyncio.gather(*readings)
        listed = {store.name for listing in listings for store in listing.stores}
        read = {listing.template for listing in listings if listing.readable}
        busy = self._busy()
        for name in list(self._on_demand):
            if self.template_of(name) in read and name not in listed and name not in busy:
                await self._close(name, "since its template's source no longer lists it")
        return listings

    async def _open(self, template: TemplateSettings, name: str) -> StoreContext | None:
        cached = self._listings.get(template.name)
        if cached is None or time.monotonic() - cached[0] > self.interval:
            listing = await self._read(template)
        else:
            listing = cached[1]
        if not listing.readable:
            raise DiscoveryError(listing.problems[0].error)
        store = next((store for store in listing.stores if store.name == name), None)
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
        busy = self._busy()
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

    async def _read(self, template: TemplateSettings) -> TemplateListing:
        listing = await list_template(template, self._taken)
        self._listings[template.name] = (time.monotonic(), listing)
        return listing
