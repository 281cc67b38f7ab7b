"""The programmatic worker: everything ``relayer run`` does, usable inside an asyncio app.

One Worker serves one or more stores (relayer.worker.served: each store's relay, maintenance,
cluster gate and transports). Each store is a dispatch queue whose jobs are lane scans keyed by
lane number, beside a queue of its maintenance jobs; one worker group (Weighted or Strict over
the stores) runs them in a pool of slots, as many as the worker's connection budget serves. The
stores of one database share the worker's connections to it (relayer.store.databases); every
database's draw on one budget, ``worker.max_connections``.

    worker = Worker([store_settings], transports={"orders": {"kafka": transport}})
    await worker.run(stop_event)   # until stop_event is set; then finishes batches and leaves

Stores join and leave a running worker with ``add_store`` and ``remove_store`` (a template's
discovery does: relayer.fleet). A served store takes every resource it needs in ``open()`` and
gives each back in ``close()``; the worker only wires them into its group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Literal

from relayer.dispatch import MemoryQueue, WorkerGroup
from relayer.dispatch.clock import MonotonicClock
from relayer.dispatch.cluster import ClusterState
from relayer.errors import ConfigurationError, UsageError
from relayer.relay.membership import new_instance_id
from relayer.relay.trace import relay_tracer
from relayer.settings import StoreSettings, WorkerSettings
from relayer.store.databases import CUT_GRACE, ConnectionPlan, Databases, plan_connections
from relayer.transports.base import Transport
from relayer.transports.lifecycle import SharedTransports
from relayer.transports.registry import create_transports
from relayer.worker.queues import StoreQueues
from relayer.worker.served import ServedStore, named_twice

logger = logging.getLogger(__name__)


class Worker:
    """Relays the ordered rows of ``stores`` until stopped. See the module docstring."""

    def __init__(
        self,
        stores: Sequence[StoreSettings],
        *,
        transports: Mapping[str, Mapping[str, Transport]] | None = None,
        settings: WorkerSettings | None = None,
        instance_id: str | None = None,
        cluster_state: ClusterState | None = None,
        tracer_provider: Any | None = None,
    ) -> None:
        """``cluster_state`` defaults to each store's PostgreSQL queue state (pause and
        concurrency limits set with ``relayer queue``), one dispatcher connection per database.
        ConfigurationError if ``settings.max_connections`` cannot serve these stores.
        ``tracer_provider`` (an OpenTelemetry SDK TracerProvider) defaults to the global one;
        without a configured provider the worker does no tracing work (relayer.relay.trace).
        ``stores`` may be empty when stores are added later (``add_store``)."""
        names = [store.name for store in stores]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise named_twice(duplicates[0])
        self.settings = settings or WorkerSettings()
        self.member = instance_id or new_instance_id()
        self.clock = MonotonicClock()
        # Every store's database shares its connections; all together within the budget.
        self.connections: ConnectionPlan = plan_connections(
            stores, self.settings, dispatcher=cluster_state is None
        )
        self.databases = Databases(self.settings, self.connections.limit)
        self._tracer = relay_tracer(tracer_provider)
        # Which stores use which transports (shared ones start once, close with their last).
        self.shared_transports = SharedTransports()
        self.queues = StoreQueues(self.settings, self.databases, gated=cluster_state is None)
        self.stores: dict[str, ServedStore] = {}
        self._joining: dict[str, StoreSettings] = {}
        self._leaving: set[str] = set()
        self._store_tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]] | None = None
        self._phase: Literal["new", "opening", "serving", "stopping", "stopped"] = "new"
        # Readiness conditions of what serves the worker (a template's discovery): each
        # returns None when satisfied, else why the worker is not ready.
        self.readiness_checks: list[Callable[[], str | None]] = []
        for store in stores:
            given = transports.get(store.name, {}) if transports is not None else None
            self._register(self._served(store, given))
        self.group: WorkerGroup[int] = WorkerGroup(
            self.queues.policy(names),
            self._sources(),
            self.queues.run,
            pool_size=self.connections.slots,
            cluster_state=cluster_state or self.queues.routes,
            clock=self.clock,
            name=f"relayer:{self.member}",
        )
        self.started = asyncio.Event()

    def _served(
        self, store: StoreSettings, transports: Mapping[str, Transport] | None
    ) -> ServedStore:
        """A store served on its database's shared connections, with the transports given
        (default: built from its settings)."""
        given = create_transports(store) if transports is None else transports
        database, gate = self.databases.get(store), self.queues.gate(store)
        return ServedStore(store, given, self.member, database, self.clock.now, gate=gate,
                           tracer=self._tracer, shared=self.shared_transports)  # fmt: skip

    def _replan(self, joining: StoreSettings | None = None) -> ConnectionPlan:
        """The connection plan of the stores served, joining and, if given, ``joining`` (the
        ConfigurationError of plan_connections if the budget cannot hold them), put in force:
        the budget's limit (when computed) and the group's slots follow it."""
        stores = [served.store for served in self.stores.values()]
        stores += [store for name, store in self._joining.items() if name not in self.stores]
        if joining is not None:
            stores.append(joining)
        dispatcher, outside = self.queues.routes is not None, self.databases.outside
        plan = plan_connections(stores, self.settings, dispatcher=dispatcher, outside=outside)
        self.connections = plan
        self.databases.budget.set_limit(plan.limit)
        self.group.pool_size = plan.slots
        return plan

    def _register(self, served: ServedStore) -> None:
        self.stores[served.store.name] = served
        self.queues.add(served)

    def _unregister(self, name: str) -> None:
        served = self.stores.pop(name, None)
        if served is not None:
            self.queues.remove(served)
        self._store_tasks.pop(name, None)

    def _serving(self) -> list[ServedStore]:
        """The stores the group dispatches: served, and not leaving."""
        return [served for name, served in self.stores.items() if name not in self._leaving]

    def _sources(self) -> list[MemoryQueue[int]]:
        """The queues of the stores served: every store's lane scans, then its maintenance."""
        serving = self._serving()
        return [served.queues[0] for served in serving] + [s.queues[1] for s in serving]

    async def _regroup(self) -> None:
        """Give the group the stores served now (from its next pass on)."""
        names = [served.store.name for served in self._serving()]
        await self.group.reconfigure(self.queues.policy(names), self._sources())

    def _stopping(self) -> float:
        """Stop claiming jobs and admitting rows; when the stop must be done (every batch in
        flight ends within half a lease of its start, so by then)."""
        self._phase = "stopping"
        self.group.stop()
        for served in self.stores.values():
            served.stop()
        stop_by = time.monotonic() + max((s.stop_budget() for s in self.stores.values()), default=0)
        self.databases.cut_at(stop_by)  # whatever PostgreSQL does, the stop ends by then
        return stop_by

    async def _finish_jobs(self, group: asyncio.Task[None], stop_by: float) -> None:
        """Let the running jobs finish until ``stop_by``; then cut the database connections
        and cancel what is left (a batch rolls back: its rows stay for the next owner)."""
        done, _ = await asyncio.wait({group}, timeout=max(stop_by - time.monotonic(), 0.0))
        if done:
            group.result()
            return
        logger.warning(
            "worker %s: jobs still running at the end of the stop budget (lease_duration / 2) "
            "were cancelled; their rows are sent by the next owner",
            self.member,
            extra={"action": "stop_cancelled", "member": self.member},
        )
        self.databases.cut()  # statements end now: cancelled, each would ask a silent server
        if not (await asyncio.wait({group}, timeout=CUT_GRACE))[0]:
            group.cancel()
        await asyncio.wait({group})

    def count_outside(self, count: int) -> None:
        """Plan ``count`` more connections outside its databases (Databases.outside_connection:
        a template's catalog); ConfigurationError if ``max_connections`` has no room."""
        self.databases.outside += count
        try:
            self._replan()
        except ConfigurationError:
            self.databases.outside -= count
            raise

    def weight(self, name: str) -> int:
        """Store ``name``'s weight in the Weighted group: the one add_store or set_weight gave,
        else worker.weights, else 1."""
        return self.queues.weight(name)

    def readiness(self) -> tuple[bool, str]:
        """Whether this worker serves every store: started, and each store's heartbeat
        succeeded within the last lease (the answer of ``/readyz``)."""
        if not self.started.is_set():
            return False, "starting"
        lapsed = [
            name
            for name, served in self.stores.items()
            if served.opened and served.relay.membership.expired()
        ]
        if lapsed:
            return False, "heartbeats failing for " + ", ".join(lapsed)
        for check in self.readiness_checks:
            reason = check()
            if reason is not None:
                return False, reason
        return True, "ready"

    @property
    def lanes(self) -> dict[str, frozenset[int]]:
        """The lanes each store's membership currently gives this worker."""
        return {name: served.relay.membership.lanes for name, served in self.stores.items()}

    # -- stores joining and leaving ----------------------------------------------------------

    async def add_store(
        self,
        store: StoreSettings,
        transports: Mapping[str, Transport] | None = None,
        *,
        weight: int | None = None,
    ) -> None:
        """Serve ``store`` too. Before ``run`` it is registered (run opens it); while the
        worker serves, it opens now (schema check, membership join, connections;
        a failure propagates and leaves nothing behind) and its queues join the group.
        ``transports`` defaults to the store's own (built from its settings); ``weight`` to
        worker.weights, else 1. ConfigurationError if the name is served already, UsageError
        while the worker starts or stops."""
        name = store.name
        if name in self.stores or name in self._joining:
            raise named_twice(name)
        if weight is not None and (isinstance(weight, bool) or weight < 1):
            raise ConfigurationError(f"stores.{name}.weight", weight, "weights are >= 1")
        if self._phase not in ("new", "serving"):
            raise UsageError(
                f"store {name!r} cannot join worker {self.member} while it is {self._phase}; "
                "add it before run() or once worker.started is set"
            )
        self._replan(store)  # refused if the budget has no room for its database
        served = self._served(store, transports)
        if weight is not None:
            self.queues.set_weight(name, weight)
        if self._phase == "new":
            self._register(served)
            await self._regroup()
            return
        self._joining[name] = store
        try:
            await served.open()
            if self._phase != "serving":  # the worker began stopping meanwhile
                await served.close()
                raise UsageError(f"worker {self.member} stopped while store {name!r} joined")
        except BaseException:
            self.queues.set_weight(name, None)
            self._joining.pop(name, None)
            self._replan()
            raise
        finally:
            self._joining.pop(name, None)
        self._register(served)
        self._start_tasks(served)
        await self._regroup()
        logger.info(
            "worker %s serving store %s too",
            self.member,
            name,
            extra={"action": "store_join", "member": self.member, "store": name},
        )

    async def set_weight(self, name: str, weight: int | None) -> None:
        """Change store ``name``'s weight (None: back to worker.weights, else 1) from the
        group's next pass on; its credit so far is kept."""
        if name not in self.stores:
            raise UsageError(f"store {name!r} is not served by worker {self.member}")
        self.queues.set_weight(name, weight)
        await self._regroup()

    async def remove_store(self, name: str) -> None:
        """Stop serving store ``name``, gracefully: its queues leave the group (no new scan),
        its batches in flight admit no new row and finish (within half a lease, then they are
        rolled back), then it leaves the membership (releasing its lanes) and closes its
        connections and the transports no other store uses."""
        served = self.stores.get(name)
        if served is None or name in self._leaving:
            raise UsageError(f"store {name!r} is not served by worker {self.member}")
        if self._phase == "new":
            self._unregister(name)
            self._replan()
            await self._regroup()
            return
        if self._phase != "serving":
            raise UsageError(
                f"store {name!r} cannot leave worker {self.member} while it is {self._phase}"
            )
        self._leaving.add(name)
        try:
            await self._regroup()
            served.relay.stop()
            stop_by = time.monotonic() + served.stop_budget()
            await self._drained(served, stop_by)
            served.halt.set()
            tasks = self._store_tasks.get(name, [])
            if tasks:
                await asyncio.wait(tasks)
            await served.close(stop_by)
        finally:
            self._leaving.discard(name)
            self._unregister(name)
            self._replan()  # its database's connections are closed if it was the last one
        logger.info(
            "worker %s no longer serves store %s",
            self.member,
            name,
            extra={"action": "store_leave", "member": self.member, "store": name},
        )

    async def _drained(self, served: ServedStore, stop_by: float) -> None:
        """Wait until the store's running jobs have finished, at most until ``stop_by`` (its
        close then rolls back the batches still in flight)."""
        finished = asyncio.gather(*(self.group.finished(queue) for queue in served.queues))
        try:
            await asyncio.wait_for(finished, max(stop_by - time.monotonic(), 0.0))
        except TimeoutError:
            logger.warning(
                "store %s: jobs still running half a lease after it began leaving worker %s "
                "are rolled back; their rows are sent by the next owner",
                served.store.name,
                self.member,
                extra={"action": "stop_cancelled", "store": served.store.name},
            )

    def _start_tasks(self, served: ServedStore) -> None:
        assert self._spawn is not None
        self._store_tasks[served.store.name] = [self._spawn(task) for task in served.tasks()]

    # -- running -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set (or the task is cancelled), then shut down gracefully:
        finish the batches in flight, release every lane and leave the membership."""
        stop = stop or asyncio.Event()
        stop_by: float | None = None
        if self._phase != "new":
            raise UsageError(f"worker {self.member} has run already; create a new Worker")
        self.group.validate()
        self._phase = "opening"
        serving = False
        try:
            for served in list(self.stores.values()):
                await served.open()
            names = ", ".join(self.stores) or "no store yet"
            logger.info(
                "worker %s serving %s",
                self.member,
                names,
                extra={"action": "start", "member": self.member},
            )
            logger.info(
                "worker %s: %s",
                self.member,
                self.connections.describe(),
                extra={"action": "connection_budget", "member": self.member},
            )
            serving = True
            async with asyncio.TaskGroup() as tasks:
                self._spawn = tasks.create_task
                for served in self.stores.values():
                    self._start_tasks(served)
                group = tasks.create_task(self.group.run())
                self._phase = "serving"
                self.started.set()
                await stop.wait()
                stop_by = self._stopping()
                await self._finish_jobs(group, stop_by)
        finally:
            self._spawn = None
            stop.set()
            if stop_by is None:
                stop_by = self._stopping()
            # Together: a stalled broker's transport must not use up the others' time.
            closed = await asyncio.gather(
                *(served.close(stop_by) for served in self.stores.values()),
                return_exceptions=True,
            )
            self._phase = "stopped"
            # A start-up failure is reported by whoever awaited run() (the CLI prints it): an
            # INFO "stopped" line just before that error would only confuse.
            logger.log(
                logging.INFO if serving else logging.DEBUG,
                "worker %s stopped" if serving else "worker %s stopped before serving",
                self.member,
                extra={"action": "stop"},
            )
        for outcome in closed:
            if isinstance(outcome, BaseException):
                raise outcome
