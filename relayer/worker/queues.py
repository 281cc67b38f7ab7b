"""The dispatch side of the stores a worker serves: their queues, the group's policy over them,
each store's cluster gate, and which part of a store runs each job.

Every served store has two queues in the worker's group: its lane scans (named after the store)
and its maintenance (``<store>:maintenance``). The group picks among them with the worker's
policy: Weighted by each store's weight (maintenance weighs 1), or Strict in the order of
``worker.weights`` (maintenance first). With the default cluster state, each store's queues are
gated by its own database's pause state and concurrency limits, on one dispatcher connection
per database.
"""

from __future__ import annotations

from collections.abc import Sequence

from relayer.dispatch import Job, PostgresClusterState, RoutedClusterState, Strict, Weighted
from relayer.dispatch.dispatcher import DispatcherConnection
from relayer.settings import StoreSettings, WorkerSettings
from relayer.store.databases import DatabaseKey, Databases
from relayer.worker.maintenance import maintenance_queue
from relayer.worker.served import ServedStore


class StoreQueues:
    """The queues, weights and gates of the stores served by one worker."""

    def __init__(self, settings: WorkerSettings, databases: Databases, *, gated: bool) -> None:
        self.settings = settings
        self.databases = databases
        # With the default cluster state, each store's queues are routed to its own gate.
        self.routes: RoutedClusterState | None = RoutedClusterState({}) if gated else None
        self._dispatchers: dict[DatabaseKey, DispatcherConnection] = {}
        self._weights: dict[str, int] = {}  # weights given to add_store or set_weight
        self._jobs: dict[str, ServedStore] = {}  # queue name -> the store whose jobs they are

    def gate(self, store: StoreSettings) -> PostgresClusterState | None:
        """A store's cluster gate on its database's dispatcher connection (shared), or None
        when the worker was given a cluster state of its own."""
        if self.routes is None:
            return None
        database = self.databases.get(store)
        dispatcher = self._dispatchers.get(database.key)
        if dispatcher is None:
            dispatcher = self._dispatchers[database.key] = DispatcherConnection(
                database.connect_dispatcher,
                pinned=store.pooler == "transaction",
                budget=self.databases.budget,
            )
        return PostgresClusterState(store, dispatcher=dispatcher)

    def add(self, served: ServedStore) -> None:
        """Route the jobs of ``served``'s queues to it (and them through its gate)."""
        name = served.store.name
        for queue in served.queues:
            self._jobs[queue.name] = served
        if self.routes is not None and served.gate is not None:
            self.routes.route((name, maintenance_queue(name)), served.gate)

    def remove(self, served: ServedStore) -> None:
        name = served.store.name
        for queue in served.queues:
            self._jobs.pop(queue.name, None)
        if self.routes is not None:
            self.routes.unroute((name, maintenance_queue(name)))
        self._weights.pop(name, None)

    async def run(self, job: Job[int]) -> int | None:
        """Run one job: a lane scan, or a maintenance task. A lane scan returns its cost for
        the Weighted policy: the rows its store sent since the last of its scans ended (a
        batch may carry lanes whose scans never ran as jobs), so that stores share rows, not
        scans, by weight; maintenance costs what it was charged."""
        served = self._jobs.get(job.queue)
        if served is None:  # a job of a store that has left
            return None
        if job.queue == served.store.name:
            await served.relay.scan(job.key)
            return served.rows_unsettled()
        await served.maintenance.run(job.key)
        return None

    def policy(self, names: Sequence[str]) -> Strict | Weighted | None:
        """The group's policy over the stores ``names`` and their maintenance queues (None
        while there is no store)."""
        if not names:
            return None
        # Maintenance queues hold at most one job per task, so they can never take more than
        # a few slots: weight 1 (Weighted), or first in line (Strict, so that lanes that are
        # always busy cannot starve the recovery of unordered rows).
        maintenance = [maintenance_queue(name) for name in names]
        if self.settings.policy == "strict":
            order = [name for name in self.settings.weights if name in names]
            return Strict(*maintenance, *order, *[name for name in names if name not in order])
        weights = [(name, self.weight(name)) for name in names]
        return Weighted(weights + [(queue, 1) for queue in maintenance])

    def weight(self, name: str) -> int:
        """Store ``name``'s weight in the Weighted group: the one add_store or set_weight gave,
        else worker.weights, else 1."""
        return self._weights.get(name) or self.settings.weights.get(name, 1)

    def set_weight(self, name: str, weight: int | None) -> None:
        if weight is None:
            self._weights.pop(name, None)
        else:
            self._weights[name] = weight
