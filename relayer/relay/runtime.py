"""One store's ordered relay in this member: its parts, put together, opened and closed.

The data flows one way through them:

    notification / probe / poll (Wakeups) -> LaneSchedule -> a slot of the worker group ->
    Scanner -> Grouping -> LaneRelay (lock, read, fenced outcome, commit) -> BatchSender ->
    transports -> ScanOutcomes (counted, next scan scheduled)

``Membership`` keeps this member's share of the lanes (heartbeats on the database clock); its
changes reach the wake-ups and the schedule here. The store's database connections (the
housekeeping session, LISTEN, the batch pool) are shared with the other stores of that database
in the worker (relayer.store.databases); ``open`` attaches to them and ``close`` detaches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from relayer.deadlines import Deadlines
from relayer.observability.throttle import ThrottledLog
from relayer.relay.batch import LaneRelay
from relayer.relay.grouping import Grouping
from relayer.relay.membership import Membership
from relayer.relay.outcomes import ScanOutcomes
from relayer.relay.probes import Prober
from relayer.relay.scanner import Scanner
from relayer.relay.schedule import LaneSchedule
from relayer.relay.stats import StoreStats
from relayer.relay.trace import RelayTracer
from relayer.relay.wakeups import Wakeups
from relayer.settings import StoreSettings
from relayer.store import RelayStore
from relayer.store.databases import Database
from relayer.transports.routing import Routing

logger = logging.getLogger(__name__)


class StoreRelay:
    """The ordered relay of one store for one member: open, run (``tasks`` and ``scan``), stop
    and close. ``lanes_changed`` is told each new share of the lanes, after the relay itself."""

    def __init__(
        self,
        store: StoreSettings,
        routing: Routing,
        member: str,
        database: Database,
        now: Callable[[], float],
        *,
        tracer: RelayTracer | None = None,
        lanes_changed: Callable[[frozenset[int]], None] | None = None,
    ) -> None:
        self.store = store
        self.member = member
        self.routing = routing
        self.deadlines = Deadlines.of(store.lease_duration)
        self._lanes_changed_too = lanes_changed
        self.opened = False
        self._attached = False
        self._joined = False
        self.stats = StoreStats()
        self.statements = RelayStore(store)
        # The connections of the store's database, shared with its other stores in this worker.
        self.database = database
        self.housekeeping = database.housekeeping.for_store(store)
        self.pool = database.pool.for_store(store)
        self.membership = Membership(
            store,
            member,
            session=self.housekeeping,
            batched=database.batched,
            on_change=self._lanes_changed,
        )
        self.schedule = LaneSchedule(store.name, now, lambda: self.membership.lanes)
        self.batch = LaneRelay(store, routing, member, tracer=tracer)
        self.prober = Prober(self.statements, session=self.housekeeping)
        self._assemble(database)

    def _assemble(self, database: Database) -> None:
        """The steps of a scan, in the order the data flows through them."""
        store, member = self.store, self.member
        self.outcomes = ScanOutcomes(
            store.name,
            self.schedule,
            self.stats,
            backoff=self.batch.backoff,
            connection_limit=lambda: database.budget.limit,
        )
        self.wakeups = Wakeups(
            store,
            member,
            membership=self.membership,
            schedule=self.schedule,
            prober=self.prober,
            database=database,
            stats=self.stats,
        )
        self.grouping = Grouping(
            self.batch,
            pool=self.pool,
            schedule=self.schedule,
            window=self.wakeups.window,
            membership=self.membership,
            stats=self.stats,
            outcomes=self.outcomes,
        )
        self.scanner = Scanner(
            member,
            membership=self.membership,
            schedule=self.schedule,
            window=self.wakeups.window,
            prober=self.prober,
            batch=self.batch,
            grouping=self.grouping,
            outcomes=self.outcomes,
        )

    def _lanes_changed(self, lanes: frozenset[int]) -> None:
        self.wakeups.lanes_changed(lanes)
        if self._lanes_changed_too is not None:
            self._lanes_changed_too(lanes)
        self.schedule.keep(lanes, self.store.lanes)
        self.wakeups.wake_all()  # probe the new share: lanes with due heads get scanned

    async def scan(self, lane: int) -> None:
        """One lane scan (a job of the store's dispatch queue, ``schedule.queue``)."""
        await self.scanner.scan(lane)

    def tasks(
        self, halt: asyncio.Event, tick: Callable[[], None] | None = None
    ) -> list[Coroutine[Any, Any, None]]:
        """What runs while the store is served, until ``halt`` is set: heartbeats, LISTEN and
        the fallback poll, which calls ``tick`` after each poll (default: write out the
        held-back counts of the relay's throttled logs)."""
        return [
            self.membership.run(halt),
            self.wakeups.listen(halt),
            self.wakeups.poll(halt, tick or self.flush_due),
        ]

    async def open(self) -> None:
        """Attach to the database's shared connections (the first store of the database
        reserves them in the worker's budget), check the schema and make the lane rows, and
        join the membership with a first heartbeat. Stores of one database joining together
        do both together: the checks in a few round trips for all (relayer.store.joins), the
        heartbeats in one (relayer.store.housekeeping). If a step fails, what was taken is
        given back and the error propagates."""
        try:
            await self.database.attach(self.store)
            self._attached = True
            if not await self.database.joins.check(self.statements):
                # The batch could not tell: check alone (the others that could not, beside).
                async with self.database.joining(self.store) as conn:
                    await self.statements.prepare(conn)
            await self.membership.beat()
            self._joined = True
        except BaseException:
            await self.close()
            raise
        self.opened = True
        if self.store.storage == "partitioned":
            logger.warning(
                "store %s: storage = 'partitioned' is not ready for production: it has not "
                "passed the fault-injection suite and the soak yet (docs/storage.md, 'What is "
                "not done yet'); keep storage = 'delete' for messages you cannot lose",
                self.store.name,
                extra={"action": "storage_experimental", "store": self.store.name},
            )

    def stop(self) -> None:
        """The worker is stopping or the store leaving it: no batch starts, and batches in
        flight admit no new row."""
        self.batch.stop()

    async def close(self) -> None:
        """Roll back batches still in flight, leave the membership (releasing every lane) and
        detach from the database's connections (the last store out closes them)."""
        self.opened = False
        # After a graceful stop no batch is left (the worker group waited for its scans); after
        # a cancellation, batches still in flight roll back first: leaving releases the lanes,
        # and a batch would hold its lanes' lease rows locked until it ended.
        await self.grouping.close()
        if self._joined:
            self._joined = False
            await self.membership.leave()
        await self.wakeups.close()
        await self.prober.close()
        if self._attached:
            self._attached = False
            await self.database.detach(self.store)

    def stop_budget(self) -> float:
        """Seconds a stop may take: every batch in flight ends within half a lease."""
        return self.deadlines.stop

    def logs(self) -> tuple[ThrottledLog, ...]:
        """The throttled logs of this relay's parts (their held-back counts are written every
        poll, and at close)."""
        listener = self.database.listener
        return (
            self.outcomes.log,
            self.batch.log,
            self.membership.log,
            *(() if listener is None else (listener.log,)),
        )

    def flush_due(self) -> None:
        for log in self.logs():
            log.flush_due()
