"""Maintenance of a store, as jobs of the worker's dispatch group.

Each store a worker serves gets a second queue, ``<store>:maintenance``, next to its lane-scan
queue, with one job per :class:`Task`:

- ``RECOVER_UNORDERED`` (every worker): send unordered rows the application did not send within
  ``unordered_grace`` (``relayer.relay.unordered``); again at once after a full batch. Several
  workers recover in parallel: claims skip each other's rows.
- ``CLEANUP`` (only the worker that owns the store's cleanup lane, :func:`cleanup_lane`, so one
  per cluster; the stores of a fleet spread over the workers): apply the retention settings
  (``cleanup``); again at once while a table has more than one pass deletes.

A job costs a claim on the dispatch gate and a batch connection. So a worker first *looks*, on
its housekeeping connection and outside the dispatch layer (:meth:`Maintenance.watch`): for an
unordered row due for recovery every ``maintenance_interval`` (up to 8 times less often while
no unordered row waits at all), and, where it leads the cleanup, every ``cleanup_interval`` at
the table health (its warnings are logged from there) and for rows a retention would delete,
in one read-only statement. Only a look that finds work schedules the job; the next look comes
an interval after the job ends. An idle store's maintenance costs a statement now and then and
no dispatch job. Without a housekeeping session the jobs themselves run every interval.

Neither task touches a lane lease, so lanes never wait for maintenance and maintenance never
waits for a lane (parked-key retention excepted: it locks the key's lane like ``relayer parked
drop``, waiting at most for one batch).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import IntEnum

from relayer.dispatch import MemoryQueue
from relayer.errors import StoreError
from relayer.lanes import fnv1a_32
from relayer.observability.throttle import ThrottledLog, shape
from relayer.operations.health import StoreHealth, with_warnings
from relayer.relay.unordered import UnorderedSender
from relayer.settings import StoreSettings
from relayer.store import (
    Connection,
    MaintenanceStore,
    Rotation,
    Session,
    Transactions,
    UnorderedStore,
    rotate,
)
from relayer.transports.routing import Routing

logger = logging.getLogger(__name__)

MAINTENANCE_QUEUE_SUFFIX = ":maintenance"
# Rows deleted per retention statement, and statements per table and pass: a long backlog is
# worked off over several passes instead of holding a slot for minutes.
CLEANUP_BATCH = 5_000
CLEANUP_ROUNDS = 40
# An idle store's recovery of unordered rows looks at most every 8 x maintenance_interval (40 s
# by default): unordered rows are sent by the application after its commit, recovery only
# catches what it could not send.
RECOVERY_IDLE_DOUBLINGS = 3


class Task(IntEnum):
    """A maintenance job; the key of its job in the store's maintenance queue."""

    RECOVER_UNORDERED = 0
    CLEANUP = 1


def maintenance_queue(store: str) -> str:
    """The dispatch queue of ``store``'s maintenance jobs (pause it with ``relayer queue``)."""
    return store + MAINTENANCE_QUEUE_SUFFIX


@dataclass(frozen=True, slots=True)
class CleanupReport:
    """Rows each retention deleted in one pass; ``skipped`` if another worker held the pass."""

    inbox: int = 0
    inbox_keys: int = 0
    sequences: int = 0
    parked_keys: int = 0
    parked_rows: int = 0
    skipped: bool = False
    complete: bool = True  # False when a table had more to delete than one pass takes


async def cleanup(conn: Connection, store: StoreSettings) -> CleanupReport:
    """Apply ``store``'s retention settings once: inbox entries and key states older than
    ``inbox_retention``, sequence counters idle longer than ``sequence_retention`` (off by
    default) and keys that waited for an operator longer than ``parked_retention`` (off by
    default; each dropped key is logged). Safe to run from several processes at once.

    ``conn`` is a psycopg AsyncConnection (autocommit off). Consumers whose database has no
    relayer worker call this themselves, now and then. StoreError for database trouble.
    """
    db = MaintenanceStore(store)
    lock = _task_lock_key(store, Task.CLEANUP)
    counts: dict[str, int] = {}
    complete = True
    plan = [
        ("inbox", "inbox_expire", store.inbox_retention),
        ("inbox_keys", "inbox_keys_expire", store.inbox_retention),
        ("sequences", "sequences_expire", store.sequence_retention),
    ]
    for name, query, retention in plan:
        counts[name] = 0
        if retention is None:
            continue
        for _ in range(CLEANUP_ROUNDS):
            deleted = await db.expire(conn, query, lock, retention, CLEANUP_BATCH)
            if deleted is None:
                return CleanupReport(skipped=True)
            counts[name] += deleted
            if deleted < CLEANUP_BATCH:
                break
        else:
            complete = False
    keys, rows = 0, 0
    if store.parked_retention is not None:
        keys, rows = await _drop_expired_parked(db, conn, store.parked_retention)
    return CleanupReport(
        counts["inbox"], counts["inbox_keys"], counts["sequences"], keys, rows, False, complete
    )


async def _drop_expired_parked(
    db: MaintenanceStore, conn: Connection, retention: timedelta
) -> tuple[int, int]:
    store = db.store
    keys = rows = 0
    for key, lane in await db.parked_expired(conn, retention, CLEANUP_BATCH):
        dropped = await db.drop_expired_parked_key(conn, key, lane, retention)
        if dropped is None:
            continue  # redriven or retried meanwhile
        keys, rows = keys + 1, rows + dropped.rows
        logger.warning(
            "store %s: parked key %r waited %.0f s for an operator (parked_retention %s s); "
            "dropped its %s rows (head %s, %s attempts, last error: %s)",
            store.name,
            key,
            dropped.waited_seconds,
            retention.total_seconds(),
            dropped.rows,
            dropped.head_id,
            dropped.attempts,
            dropped.error,
            extra={
                "action": "parked_expired",
                "store": store.name,
                "lane": lane,
                "key": key,
                "rows": dropped.rows,
                "error": dropped.error,
            },
        )
    return keys, rows


def cleanup_lane(store: StoreSettings) -> int:
    """The lane whose owner leads ``store``'s cleanup: the same for every member of the store
    (it follows the store's tables and lane count), and spread over the lanes across stores,
    so that the workers of a fleet share the cleanups instead of the owner of lane 0 running
    every store's."""
    return fnv1a_32(f"{store.db_schema}.{store.table_prefix}".encode()) % store.lanes


def _task_lock_key(store: StoreSettings, task: Task) -> int:
    """A 63-bit advisory-lock key for ``task`` of ``store`` (distinct from the schema lock)."""
    high = fnv1a_32(f"{store.db_schema}.{store.table_prefix}".encode())
    low = fnv1a_32(f"maintenance:{task.name}".encode())
    return ((high << 32) | low) & 0x7FFF_FFFF_FFFF_FFFF


class Maintenance:
    """The maintenance queue of one store in a worker, and the handler of its jobs.

    ``leader()`` tells whether this worker runs the cluster's cleanup (the worker owning the
    store's :func:`cleanup_lane`). Jobs borrow a connection from the store's batch pool, like
    lane batches; a job is one slot. With ``session`` (the worker's housekeeping connection),
    :meth:`watch` looks there for work first and schedules a job only when it finds some.
    """

    def __init__(
        self,
        store: StoreSettings,
        routing: Routing,
        pool: Transactions,
        now: Callable[[], float],
        leader: Callable[[], bool],
        *,
        session: Session | None = None,
    ) -> None:
        self.store = store
        self.pool = pool
        self.session = session
        self.unordered = UnorderedStore(store)
        self.now = now
        self.leader = leader
        self.queue: MemoryQueue[int] = MemoryQueue(maintenance_queue(store.name))
        self.sender = UnorderedSender(store, routing)
        self.db = MaintenanceStore(store)
        # Unordered rows this worker's recovery sent, and failed attempts (exported as metrics).
        self.recovered = 0
        self.recovery_failed = 0
        self.last_cleanup: CleanupReport | None = None
        self.last_health: StoreHealth | None = None
        self._health_read_at = 0.0  # self.now() when last_health was read
        # Recovery looks in a row that found no unordered row at all: the next look waits twice
        # as long after each, up to 2**RECOVERY_IDLE_DOUBLINGS x maintenance_interval (idle
        # stores of a large fleet cost a query each every maintenance_interval otherwise).
        self._empty_looks = 0
        self._started = False
        self._leading = False
        # With a session: when each task's next look is due (None: no look planned: its job is
        # scheduled or running, or this worker does not lead the cleanup), the tasks whose job
        # a look scheduled and that has not ended yet, and what wakes ``watch`` for a change.
        self._looks: dict[Task, float | None] = {task: None for task in Task}
        self._jobs: set[Task] = set()
        self._changed = asyncio.Event()
        # After an outage, recovery sends batch after batch, and a task fails every retry.
        self.log = ThrottledLog(logger)

    @property
    def planned_looks(self) -> dict[Task, float]:
        """When each planned look is due (with a session), by task: what an idle store's
        maintenance waits for."""
        return {task: due for task, due in self._looks.items() if due is not None}

    def start(self) -> None:
        """Begin recovery now, and the cleanup if this worker leads the store's cleanup."""
        self._started = True
        self._plan(Task.RECOVER_UNORDERED, self.now())
        self.lanes_changed()

    def lanes_changed(self) -> None:
        """The member's share changed: a worker that has just come to own the cleanup lane
        leads the cleanup, from now on (only the leader plans it: the others would spend a
        look or a dispatch job a minute per store for nothing)."""
        if not self._started:
            return
        was_leading, self._leading = self._leading, self.leader()
        if self._leading and not was_leading:
            self._plan(Task.CLEANUP, self.now())

    def _plan(self, task: Task, at: float) -> None:
        """``task``'s next step at ``at``: its look (with a session, unless its job is still
        to end, which plans the next look), else its job."""
        if self.session is None:
            self.queue.schedule(task, at)
        elif task not in self._jobs:
            self._looks[task] = at
            self._changed.set()

    def _start_job(self, task: Task) -> None:
        self._jobs.add(task)
        self.queue.schedule(task, self.now())

    async def watch(self, stop: asyncio.Event) -> None:
        """Until ``stop`` is set: each look when it is due (with a session; without one the
        jobs are the schedule and this returns at once). A look that finds work schedules its
        job; one that fails is tried again after retry_backoff (at most 10 s)."""
        if self.session is None:
            return
        while not stop.is_set():
            now = self.now()
            for task, due in list(self._looks.items()):
                if due is not None and due <= now:
                    self._looks[task] = None
                    await self._look(task)
            self._changed.clear()
            planned = [due for due in self._looks.values() if due is not None]
            timeout = max(min(planned) - self.now(), 0.0) if planned else None
            waits = {
                asyncio.ensure_future(stop.wait()),
                asyncio.ensure_future(self._changed.wait()),
            }
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()

    async def _look(self, task: Task) -> None:
        try:
            if task is Task.RECOVER_UNORDERED:
                await self._look_for_unordered()
            else:
                await self._look_at_tables()
        except StoreError as exc:  # the gateway's, with a redacted message
            retry = self._failed(task, exc)
            if task not in self._jobs:
                self._looks[task] = self.now() + retry

    async def _look_for_unordered(self) -> None:
        assert self.session is not None
        async with self.session.connection("look for unordered rows") as conn:
            due, waiting = await self.unordered.look(conn)
        interval = self.store.maintenance_interval.total_seconds()
        if due:
            self._empty_looks = 0
            self._start_job(Task.RECOVER_UNORDERED)
            return
        if waiting:  # rows within their grace: due soon, look as usual
            self._empty_looks = 0
        else:
            self._empty_looks += 1
            interval *= 1 << min(self._empty_looks - 1, RECOVERY_IDLE_DOUBLINGS)
        self._looks[Task.RECOVER_UNORDERED] = self.now() + interval

    async def _look_at_tables(self) -> None:
        if not self.leader():
            self._leading = False  # lanes_changed plans it when the cleanup lane comes back
            return
        assert self.session is not None
        async with self.session.connection("read the table health") as conn:
            health, retention_due = await self.db.look(conn)
        self._report(health)
        if retention_due or self.store.storage == "partitioned":  # partitions to rotate
            self._start_job(Task.CLEANUP)  # the next look comes when it has ended
            return
        self.last_cleanup = CleanupReport()  # a pass with nothing to delete
        self._looks[Task.CLEANUP] = self.now() + self.store.cleanup_interval.total_seconds()

    def partitions_ahead(self) -> float | None:
        """How far ahead of the database clock the newest partition reaches now, in seconds:
        what the last health read found (before its rotation: the low point of a cleanup
        interval) less the time since, so it keeps falling if the reads stop. None unless this
        worker leads a partitioned store's cleanup and has read its health."""
        health = self.last_health
        if not self._leading or health is None or health.partitions_ahead_seconds is None:
            return None
        return health.partitions_ahead_seconds - (self.now() - self._health_read_at)

    def _report(self, health: StoreHealth) -> None:
        self.last_health = health = with_warnings(health, self.store)
        self._health_read_at = self.now()
        for warning in health.warnings:
            logger.warning(
                "store %s: %s",
                self.store.name,
                warning,
                extra={"action": "health", "store": self.store.name},
            )

    def _rotated(self, rotation: Rotation) -> None:
        """Log what a rotation of the partitions did (docs/storage.md#rotation)."""
        if rotation.created or rotation.dropped or rotation.finalized:
            logger.info(
                "store %s: partitions created %s, dropped %s, detaches finished %s",
                self.store.name,
                len(rotation.created),
                len(rotation.dropped),
                len(rotation.finalized),
                extra={"action": "partitions_rotated", "store": self.store.name},
            )
        if rotation.skipped:
            self.log.warning(
                ("rotation_skipped", shape(rotation.skipped)),
                "store %s: partition rotation stopped early: %s; it is tried again in "
                "cleanup_interval (a transaction holding a lock on the outbox for that long "
                "keeps passed partitions; look at pg_locks if it lasts)",
                self.store.name,
                rotation.skipped,
                extra={"action": "rotation_skipped", "store": self.store.name},
            )

    def _failed(self, task: Task, exc: StoreError) -> float:
        """Log a failed look or job (one line per cause); the seconds before it is retried."""
        retry = min(self.store.retry_backoff.total_seconds(), 10.0)
        self.log.warning(
            ("maintenance_failed", task, shape(str(exc))),
            "store %s: maintenance task %s failed: %s; retrying in %.0f s",
            self.store.name,
            task.name.lower(),
            exc,
            retry,
            extra={"action": "maintenance_failed", "store": self.store.name},
        )
        return retry

    async def run(self, key: int) -> None:
        """Run one job and plan what comes next (the job again at once when there is more to
        do; otherwise the next look, or without a session the job, an interval later); never
        raises for database trouble."""
        task = Task(key)
        try:
            if task is Task.RECOVER_UNORDERED:
                next_in = await self._recover()
            else:
                cleanup_in = await self._cleanup()
                if cleanup_in is None:  # not the leader (any more): lanes_changed plans it
                    self._jobs.discard(task)
                    return
                next_in = cleanup_in
        except StoreError as exc:
            next_in = self._failed(task, exc)
        if next_in <= 0.0 and task in self._jobs:
            self.queue.schedule(task, self.now())  # more to do: the job again, no look first
            return
        self._jobs.discard(task)
        self._plan(task, self.now() + next_in)

    async def _recover(self) -> float:
        async with self.pool.connection("recover unordered rows") as conn:
            result = await self.sender.recover(conn, self.store.batch_size)
        self.recovered += result.sent
        self.recovery_failed += result.failed
        if result.sent:
            self.log.info(
                ("unordered_recovered",),
                "store %s: recovered %s unordered rows",
                self.store.name,
                result.sent,
                extra={
                    "action": "unordered_recovered",
                    "store": self.store.name,
                    "rows": result.sent,
                },
            )
        if result.error:
            return self.store.retry_backoff.total_seconds()
        if result.claimed >= self.store.batch_size:
            return 0.0
        return self.store.maintenance_interval.total_seconds()

    async def _cleanup(self) -> float | None:
        interval = self.store.cleanup_interval.total_seconds()
        if not self.leader():
            self._leading = False  # lanes_changed plans it when the cleanup lane comes back
            return None
        async with self.pool.connection("clean up") as conn:
            report = await cleanup(conn, self.store)
            if self.session is None:  # no look read the health: read it here
                self._report(await self.db.health(conn))
        if self.store.storage == "partitioned":
            self._rotated(await rotate(self.store))
        self.last_cleanup = report
        return interval if report.complete else 0.0
