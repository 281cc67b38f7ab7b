"""One store served by a worker: its ordered relay, its maintenance, its cluster gate and its
transports, taken in order when it joins and given back in reverse when it leaves.

The worker's group runs the jobs of two queues per store: lane scans (``relay.schedule.queue``,
run by ``relay.scan``) and maintenance tasks (``maintenance.queue``, run by ``maintenance.run``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from relayer.dispatch import MemoryQueue, PostgresClusterState
from relayer.errors import ConfigurationError
from relayer.relay.runtime import StoreRelay
from relayer.relay.trace import RelayTracer
from relayer.settings import StoreSettings
from relayer.store.databases import Database
from relayer.transports.base import Transport
from relayer.transports.lifecycle import SharedTransports
from relayer.transports.routing import Routing
from relayer.worker.maintenance import Maintenance, cleanup_lane

# A stopping worker closes its transports within what is left of its stop budget
# (lease_duration / 2, by which every batch in flight has ended), but gives them at least this
# long (seconds).
CLOSE_FLOOR = 0.1


class ServedStore:
    """One store this worker serves (see the module docstring)."""

    def __init__(
        self,
        store: StoreSettings,
        transports: Mapping[str, Transport],
        member: str,
        database: Database,
        now: Callable[[], float],
        *,
        tracer: RelayTracer | None = None,
        gate: PostgresClusterState | None = None,
        shared: SharedTransports | None = None,
    ) -> None:
        self.store = store
        self.member = member
        self.transports = dict(transports)
        # Its queues' pause state and concurrency limits (None: the worker's cluster_state).
        self.gate = gate
        self.shared = shared or SharedTransports()
        # Set when the worker stops or the store leaves it: ends heartbeats, LISTEN, polls and
        # maintenance looks.
        self.halt = asyncio.Event()
        self._gate_open = False
        self._transports_held = False
        self._closing: asyncio.Future[None] | None = None
        self._settled = 0  # rows sent counted in scans' costs so far (rows_unsettled)
        self.routing = Routing(store, self.transports)
        self.relay = StoreRelay(
            store, self.routing, member, database, now, tracer=tracer, lanes_changed=self._moved
        )
        # Unordered recovery and retention, in a queue of their own (relayer.worker.maintenance).
        leading = cleanup_lane(store)
        self.maintenance = Maintenance(
            store,
            self.routing,
            self.relay.pool,
            now,
            leader=lambda: leading in self.relay.membership.lanes,
            session=self.relay.housekeeping,
        )

    def rows_unsettled(self) -> int:
        """Rows the store sent since the last call (the cost of a lane scan that just ended,
        for the worker's Weighted group)."""
        sent = self.relay.stats.sent
        rows, self._settled = sent - self._settled, sent
        return rows

    def _moved(self, lanes: frozenset[int]) -> None:
        self.maintenance.lanes_changed()  # the cleanup runs where its lane is

    @property
    def opened(self) -> bool:
        return self.relay.opened

    @property
    def queues(self) -> tuple[MemoryQueue[int], MemoryQueue[int]]:
        """The store's two dispatch queues: lane scans, then maintenance."""
        return self.relay.schedule.queue, self.maintenance.queue

    def tasks(self) -> list[Coroutine[Any, Any, None]]:
        """What runs while the store is served, until ``halt`` is set."""
        return [*self.relay.tasks(self.halt, self.flush_due), self.maintenance.watch(self.halt)]

    async def open(self) -> None:
        """Take what the store needs, in order: its dispatch gate's connection (so that a
        database out of reach is said first, before any broker's trouble), its transports
        (one shared with other stores starts with the first), its relay (the database's
        shared connections, a schema check that covers the gate's, a first heartbeat) and the
        maintenance schedule. If a step fails, what was taken is given back (``close``) and
        the error propagates."""
        try:
            if self.gate is not None:
                await self.gate.open(schema_checked=True)
                self._gate_open = True
            await self.shared.acquire(self.transports.values(), close_within=self.stop_budget())
            self._transports_held = True
            await self.relay.open()
            self.maintenance.start()
        except BaseException:
            await self.close()
            raise

    def stop(self) -> None:
        """Admit no new row and start no batch; end heartbeats, LISTEN and polls."""
        self.relay.stop()
        self.halt.set()

    async def close(self, stop_by: float | None = None) -> None:
        """Give back what ``open`` took: roll back batches still in flight, leave the
        membership (releasing every lane), close the connections, the gate and the transports
        no other store uses, within ``stop_by`` (time.monotonic(); default: half a lease from
        now). Calling it again waits for the first call."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close(stop_by))
        await self._closing

    async def _close(self, stop_by: float | None) -> None:
        if stop_by is None:
            stop_by = time.monotonic() + self.stop_budget()
        self.halt.set()
        await self.relay.close()
        if self.gate is not None and self._gate_open:
            await self.gate.close()
        if self._transports_held:
            within = max(stop_by - time.monotonic(), CLOSE_FLOOR)
            await self.shared.release(self.transports.values(), close_within=within)
        for log in (*self.relay.logs(), self.maintenance.log, self.maintenance.sender.log):
            log.flush()

    def stop_budget(self) -> float:
        """Seconds a stop may take: every batch in flight ends within half a lease."""
        return self.relay.stop_budget()

    def flush_due(self) -> None:
        """Write the held-back counts of the throttled logs whose interval ended (after each
        fallback poll)."""
        self.relay.flush_due()
        self.maintenance.log.flush_due()
        self.maintenance.sender.log.flush_due()


def named_twice(name: str) -> ConfigurationError:
    return ConfigurationError(
        "stores", name, "is named twice; store names are case-sensitive and unique in a process"
    )
