"""A worker's fleet: the stores templates' discovery sources yield, joining and leaving.

Each template's source is read when the worker has started and again every
``discover_interval`` (give or take a tenth, so that workers started together do not read it
together), one read at a time. Each row is validated like a configured store; a bad row is
skipped with one line saying what to fix, the others are served. Then the worker is brought to
what was found: new stores join (``Worker.add_store``: schema check, membership, connections),
stores no longer listed leave gracefully (``Worker.remove_store``: their batches finish, their
lanes are released, they leave the membership), a store whose settings changed leaves and joins
again, and weights and concurrency limits follow their rows. A source that cannot be read keeps
the stores found last, with one warning per cause per interval saying what to fix; a store that
cannot join is tried again at the next refresh.

Every worker running the template serves every store it yields: each store's membership splits
its lanes between them (docs/fleet.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from relayer.deadlines import Deadlines
from relayer.dispatch.control import ensure_limit
from relayer.errors import ConfigurationError, RelayerError, UsageError
from relayer.fleet.sources import DiscoveryError, read_source
from relayer.fleet.templates import DiscoveredStore, Row, tables_of, validate_rows
from relayer.observability.throttle import ThrottledLog, shape
from relayer.redact import redact
from relayer.settings import TemplateSettings
from relayer.transports.base import Transport
from relayer.worker import Worker

logger = logging.getLogger(__name__)

# Each refresh waits discover_interval times a factor from 1 - JITTER to 1 + JITTER.
JITTER = 0.1

Reader = Callable[[TemplateSettings], Awaitable[list[Row]]]
TransportFactory = Callable[[TemplateSettings], Mapping[str, Transport]]


def template_transports(template: TemplateSettings) -> dict[str, Transport]:
    """The transports of a template's settings, new instances (not started)."""
    from relayer.transports.registry import create_transports

    return create_transports(template)


@dataclass(slots=True)
class Refresh:
    """What one refresh of a template did (for logs and tests)."""

    template: str
    read: bool = False  # False: the source could not be read; nothing changed
    found: int = 0  # valid stores the source yields
    joined: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # rows refused, and stores that failed to join


class Fleet:
    """Serves in ``worker`` the stores of ``templates`` (see the module docstring).

    ``await fleet.run(stop)`` runs the worker and the refreshes until ``stop`` is set;
    ``refresh(name)`` reads one template's source and applies it now. The stores of a
    template share one set of transports, built by ``transports`` (default: from the
    template's settings) when the first of them joins and held open by the fleet while any of
    them is served; built anew after the last one left.
    """

    def __init__(
        self,
        worker: Worker,
        templates: Sequence[TemplateSettings],
        *,
        reader: Reader = read_source,
        transports: TransportFactory = template_transports,
        rng: random.Random | None = None,
    ) -> None:
        self.worker = worker
        self.templates = {template.name: template for template in templates}
        self._read = reader
        self._build_transports = transports
        self._rng = rng or random.Random()
        # Per template: the stores that joined the worker, as they were found.
        self.served: dict[str, dict[str, DiscoveredStore]] = {name: {} for name in self.templates}
        self._limits: dict[str, int] = {}  # concurrency limits applied, by store
        self._transports: dict[str, Mapping[str, Transport]] = {}
        self._read_once: set[str] = set()
        self._reading: set[str] = set()  # templates whose source is being read now
        self._refreshing: dict[str, asyncio.Lock] = {
            name: asyncio.Lock() for name in self.templates
        }
        self._log = ThrottledLog(logger)
        self._stopping = False
        # A catalog query's connection counts in worker.max_connections: one per template
        # with a query source (its reads come one at a time).
        worker.count_outside(sum(1 for t in templates if t.discovery.query is not None))
        worker.readiness_checks.append(self._readiness)

    def _readiness(self) -> str | None:
        waiting = [name for name in self.templates if name not in self._read_once]
        if waiting:
            return "discovery not read yet for template " + ", ".join(waiting)
        return None

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Run the worker until ``stop`` is set, refreshing every template meanwhile. Errors
        of the worker propagate as its ``run`` raises them."""
        stop = stop or asyncio.Event()
        loops = [asyncio.create_task(self._loop(name, stop)) for name in self.templates]
        letting_go = asyncio.create_task(self._let_go_when(stop))
        try:
            await self.worker.run(stop)
        finally:
            stop.set()
            ended = await asyncio.gather(*loops, letting_go, return_exceptions=True)
            for name in list(self._transports):  # joins that ended after the stop
                await self._drop_transports(self.templates[name])
        for outcome in ended:  # a refresh loop's own failure, once the worker stopped cleanly
            if isinstance(outcome, BaseException):
                raise outcome

    async def _let_go_when(self, stop: asyncio.Event) -> None:
        """Once stopping, hand the templates' transports to their stores: the last store to
        close closes them, within the worker's stop budget."""
        await stop.wait()
        self._stopping = True
        for name in list(self._transports):
            await self._drop_transports(self.templates[name])

    async def _loop(self, name: str, stop: asyncio.Event) -> None:
        if not await _first(self.worker.started, stop):
            return
        interval = self.templates[name].discover_interval.total_seconds()
        while not stop.is_set():
            refresh = asyncio.ensure_future(self.refresh(name))
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({refresh, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not refresh.done():
                # A read still under way is dropped; stores joining or leaving finish (the
                # worker refuses them, or completes them as it stops).
                if name in self._reading:
                    refresh.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await refresh
                return
            try:
                refresh.result()
            except Exception:  # a bug: keep refreshing, say so
                logger.exception(
                    "template %s: a refresh failed unexpectedly (a bug: please report it); the "
                    "stores found last are still served, the next refresh runs as planned",
                    name,
                    extra={"action": "discovery_failed", "template": name},
                )
            wait = interval * self._rng.uniform(1 - JITTER, 1 + JITTER)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    async def refresh(self, name: str) -> Refresh:
        """Read template ``name``'s source once and bring the worker to what it yields."""
        async with self._refreshing[name]:
            report = Refresh(name)
            template = self.templates[name]
            self._reading.add(name)
            try:
                async with self._catalog_unit(template):
                    rows = await self._read(template)
            except DiscoveryError as exc:
                self._read_failed(template, exc)
                return report
            finally:
                self._reading.discard(name)
            report.read = True
            self._read_once.add(name)
            found = self._validate(template, rows, report)
            report.found = len(found)
            with contextlib.suppress(UsageError):  # the worker is stopping: no more changes
                await self._apply(template, found, report)
            return report

    def _catalog_unit(self, template: TemplateSettings) -> AbstractAsyncContextManager[None]:
        """Room in the worker's connection budget for the catalog connection of a query
        source while it is read (a file source needs none)."""
        if template.discovery.query is None:
            return contextlib.nullcontext()
        return self.worker.databases.outside_connection()

    def _read_failed(self, template: TemplateSettings, exc: DiscoveryError) -> None:
        served = len(self.served[template.name])
        self._log.warning(
            ("discovery_failed", template.name, shape(redact(str(exc)))),
            "template %s: %s; still serving the %s store(s) found last, reading the source "
            "again every %g s",
            template.name,
            redact(str(exc)),
            served,
            template.discover_interval.total_seconds(),
            extra={"action": "discovery_failed", "template": template.name},
        )

    def _validate(
        self, template: TemplateSettings, rows: list[Row], report: Refresh
    ) -> dict[str, DiscoveredStore]:
        """The valid stores of ``rows``, in order; the others are reported and skipped."""
        # Tables other stores of this worker use (configured, or another template's).
        taken = {
            tables_of(r.store): r.store.name
            for r in self.worker.stores.values()
            if r.store.name not in self.served[template.name]
        }
        found, skipped = validate_rows(template, rows, taken)
        for exc in skipped:
            self._skip(template, exc, report)
        return found

    def _skip(self, template: TemplateSettings, exc: ConfigurationError, report: Refresh) -> None:
        report.skipped.append(exc.field)
        self._log.warning(
            ("discovered_store_invalid", template.name, exc.field, shape(exc.rule)),
            "template %s: skipping a store %s yields: %s; fix its row (the next refresh, every "
            "%g s, reads it again)",
            template.name,
            template.discovery.describe(),
            redact(str(exc)),
            template.discover_interval.total_seconds(),
            extra={"action": "discovered_store_invalid", "template": template.name},
        )

    async def _apply(
        self, template: TemplateSettings, found: dict[str, DiscoveredStore], report: Refresh
    ) -> None:
        served = self.served[template.name]
        changed = [n for n in served if n in found and found[n].settings != served[n].settings]
        gone = [n for n in served if n not in found]
        await self._join_all(template, [found[n] for n in found if n not in served], report)
        left = await asyncio.gather(
            *(self._leave(template, name, report) for name in gone + changed),
            return_exceptions=True,
        )
        for outcome in left:
            if isinstance(outcome, BaseException):
                raise outcome  # UsageError: the worker is stopping
        await self._join_all(template, [found[name] for name in changed], report)  # anew
        for name, store in found.items():
            old = served.get(name)
            if old is None or name in changed:
                continue  # joined just now, with its weight and limit (or failed to)
            if old.weight != store.weight:
                await self.worker.set_weight(name, store.weight)
            served[name] = store
            await self._limit(template, store)
        if not served:  # no store left to share them: closed now, new ones for the next
            await self._drop_transports(template)

    async def _join_all(
        self, template: TemplateSettings, stores: list[DiscoveredStore], report: Refresh
    ) -> None:
        """Let ``stores`` join, all at once, through the template's transports (held open by
        the fleet meanwhile, so that a store failing to join never closes them under the
        others). The worker's connection budget bounds what they open: the stores of one
        database check their schemas together, on one connection (relayer.store.joins), a
        database the budget has no room for is refused, and one slow database holds up only
        its own stores."""
        if not stores:
            return
        transports = await self._hold_transports(template)
        if transports is None:
            report.skipped += [store.name for store in stores]
            return

        async def join(store: DiscoveredStore) -> None:
            if self._stopping:
                raise UsageError("the worker is stopping")
            await self._join(template, store, transports, report)

        joined = await asyncio.gather(*(join(store) for store in stores), return_exceptions=True)
        for outcome in joined:
            if isinstance(outcome, BaseException):
                raise outcome  # UsageError: the worker is stopping

    async def _hold_transports(self, template: TemplateSettings) -> Mapping[str, Transport] | None:
        held = self._transports.get(template.name)
        if held is not None:
            return held
        built = self._build_transports(template)
        try:
            await self.worker.shared_transports.acquire(
                built.values(), close_within=Deadlines.of(template.lease_duration).stop
            )
        except Exception as exc:
            self._log.warning(
                ("transports_failed", template.name, shape(redact(str(exc)))),
                "template %s: its transports could not start: %s; its new stores join at the "
                "next refresh (every %g s)",
                template.name,
                redact(str(exc)),
                template.discover_interval.total_seconds(),
                extra={"action": "store_join_failed", "template": template.name},
            )
            return None
        self._transports[template.name] = built
        return built

    async def _drop_transports(self, template: TemplateSettings) -> None:
        held = self._transports.pop(template.name, None)
        if held is not None:
            await self.worker.shared_transports.release(
                held.values(), close_within=Deadlines.of(template.lease_duration).stop
            )

    async def _join(
        self,
        template: TemplateSettings,
        store: DiscoveredStore,
        transports: Mapping[str, Transport],
        report: Refresh,
    ) -> None:
        served = self.served[template.name]
        try:
            await self.worker.add_store(store.settings, transports, weight=store.weight)
        except UsageError:
            raise
        except RelayerError as exc:  # schema not applied, database down, transport refused
            report.skipped.append(store.name)
            self._log.warning(
                ("store_join_failed", store.name, shape(redact(str(exc)))),
                "template %s: store %s could not join: %s; it is tried again at every refresh "
                "(every %g s)",
                template.name,
                store.name,
                redact(str(exc)),
                template.discover_interval.total_seconds(),
                extra={"action": "store_join_failed", "template": template.name},
            )
            return
        served[store.name] = store
        report.joined.append(store.name)
        await self._limit(template, store)

    async def _leave(self, template: TemplateSettings, name: str, report: Refresh) -> None:
        self.served[template.name].pop(name, None)
        self._limits.pop(name, None)
        try:
            await self.worker.remove_store(name)
        except UsageError:
            raise
        except RelayerError as exc:  # it has left all the same: closing something failed
            self._log.warning(
                ("store_leave_failed", name, shape(redact(str(exc)))),
                "template %s: store %s left, but closing its resources failed: %s; its lanes "
                "are free when their leases expire",
                template.name,
                name,
                redact(str(exc)),
                extra={"action": "store_leave_failed", "template": template.name},
            )
        report.left.append(name)

    async def _limit(self, template: TemplateSettings, store: DiscoveredStore) -> None:
        """Set the store's cluster-wide concurrency limit when its row (or template) gives one
        that is not in force yet; a store without one keeps whatever limit it has."""
        limit = store.concurrency_limit
        if limit is None or self._limits.get(store.name) == limit:
            return
        try:
            await ensure_limit(
                store.settings,
                limit,
                by=f"discovery:{self.worker.member}",
                reason=f"concurrency_limit of template {template.name}'s row",
            )
        except RelayerError as exc:
            self._log.warning(
                ("limit_failed", store.name, shape(redact(str(exc)))),
                "template %s: setting the concurrency limit of store %s to %s failed: %s; "
                "tried again at the next refresh",
                template.name,
                store.name,
                limit,
                redact(str(exc)),
                extra={"action": "limit_failed", "template": template.name},
            )
            return
        self._limits[store.name] = limit


async def _first(event: asyncio.Event, stop: asyncio.Event) -> bool:
    """Wait for ``event`` or ``stop``: True if ``event`` came first."""
    waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())}
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return event.is_set() and not stop.is_set()
