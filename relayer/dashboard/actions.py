"""The dashboard's changes: the CLI's service functions, with a guard and the dashboard as
the audit trail's source.

A single key's redrive or drop carries the head id and attempts the operator saw
(:class:`relayer.operations.parked.Guard`); a bulk run over every key matching a filter reads
keyset pages of ``BULK_BATCH`` keys as of the moment it started, applies each key with the
guard of the page it read, reports progress and can be cancelled between keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass, field

from relayer.dispatch.control import require_dispatch_schema
from relayer.operations import parked
from relayer.operations.queues import change_queue as change_queue_of
from relayer.redact import redact
from relayer.settings import StoreSettings
from relayer.store.dashboard import DashboardPool
from relayer.store.inspection import ParkedFilter, parked_page

logger = logging.getLogger(__name__)

SOURCE = "dashboard"
BULK_BATCH = 500
BULK_CONFIRM = 100  # bulk runs of this many keys or more need the count typed
REASON_LIMIT = 500


def queue_actor(actor: str) -> str:
    """The actor of a queue change: the queue audit trail has no source column, so the
    dashboard's changes are told apart by this prefix."""
    return f"{SOURCE}:{actor}"


def clean_reason(reason: str | None) -> str | None:
    text = " ".join((reason or "").split())
    return text[:REASON_LIMIT] or None


async def change_key(
    pool: DashboardPool,
    store: StoreSettings,
    key: str,
    action: str,
    *,
    guard: parked.Guard,
    actor: str,
    reason: str | None,
) -> parked.KeyOutcome:
    async with pool.connection() as conn:
        await require_dispatch_schema(conn, store)
        return await parked.change_key(
            conn,
            store,
            key,
            action,
            guard=guard,
            actor=parked.Actor(SOURCE, actor),
            reason=reason,
        )


async def change_queue(
    pool: DashboardPool,
    store: StoreSettings,
    action: str,
    *,
    queue: str | None,
    actor: str,
    reason: str | None,
    limit: int | None = None,
) -> None:
    """``pause``/``resume`` ``queue`` (None: every queue, the '*' pause) or set its ``limit``."""
    async with pool.connection() as conn:
        await change_queue_of(
            conn, store, action, queue=queue, by=queue_actor(actor), reason=reason, limit=limit
        )


@dataclass(slots=True)
class BulkRun:
    """A redrive or drop of every key matching a filter, in the background."""

    id: int
    store: str
    action: str
    where: ParkedFilter
    actor: str
    reason: str | None
    expected: int  # the count the operator confirmed
    done: int = 0
    applied: int = 0
    skipped: int = 0  # stale or no longer parked: changed since the page was read
    rows: int = 0
    finished: bool = False
    cancelled: bool = False
    error: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class BulkRuns:
    """The bulk runs of this dashboard process (kept until it stops)."""

    def __init__(self) -> None:
        self.runs: dict[int, BulkRun] = {}
        self._ids = itertools.count(1)

    def start(
        self,
        pool: DashboardPool,
        store: StoreSettings,
        action: str,
        where: ParkedFilter,
        *,
        actor: str,
        reason: str | None,
        expected: int,
    ) -> BulkRun:
        run = BulkRun(next(self._ids), store.name, action, where, actor, reason, expected)
        run.task = asyncio.create_task(self._run(pool, store, run))
        self.runs[run.id] = run
        return run

    def running(self) -> set[str]:
        """The stores with a bulk run still going."""
        return {run.store for run in self.runs.values() if not run.finished}

    def cancel(self, run_id: int) -> BulkRun | None:
        run = self.runs.get(run_id)
        if run is not None and not run.finished:
            run.cancelled = True
        return run

    async def close(self) -> None:
        for run in self.runs.values():
            run.cancelled = True
            if run.task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await run.task

    async def _run(self, pool: DashboardPool, store: StoreSettings, run: BulkRun) -> None:
        who = parked.Actor(SOURCE, run.actor)
        try:
            async with pool.connection() as conn:
                await require_dispatch_schema(conn, store)
                page = await parked_page(conn, store, run.where, limit=BULK_BATCH)
                as_of = page.as_of
                while page.keys and not run.cancelled:
                    for key in page.keys:
                        if run.cancelled:
                            break
                        outcome = await parked.change_key(
                            conn,
                            store,
                            key.key,
                            run.action,
                            guard=parked.Guard(key.head_id, key.attempts),
                            actor=who,
                            reason=run.reason,
                            audited=True,
                        )
                        run.done += 1
                        run.rows += outcome.rows
                        if outcome.applied:
                            run.applied += 1
                        else:
                            run.skipped += 1
                    if page.next_after is None:
                        break
                    page = await parked_page(
                        conn, store, run.where, as_of=as_of, after=page.next_after, limit=BULK_BATCH
                    )
        except Exception as exc:  # reported on the page; the run stops where it was
            run.error = redact(str(exc).splitlines()[0] if str(exc) else repr(exc))
            logger.warning(
                "store %s: bulk %s stopped after %d keys: %s; run it again for the rest",
                store.name,
                run.action,
                run.done,
                run.error,
                extra={"action": "dashboard_bulk_failed", "store": store.name},
            )
        finally:
            run.finished = True
