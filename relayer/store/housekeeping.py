"""What the stores of one database send together on their shared housekeeping connection.

A worker's stores of one database share one housekeeping session (relayer.store.databases).
Each store heartbeats and polls on timers of its own, but the timers are aligned
(:func:`next_tick`: the next multiple of the interval on the monotonic clock), so that the
stores' timers end in the same event-loop turn; what they ask for in one turn goes to the
server together:

- heartbeats: one pipeline (one round trip, each store's statement kept prepared on the
  connection unless a transaction pooler is in front of it). The pipeline is one implicit
  transaction, so one store's failing statement fails them all: then each store of the batch
  beats on its own, and a store whose heartbeat failed keeps beating on its own until one
  succeeds, so that a store whose tables are gone costs the others nothing;
- idle stores' probes: one statement, a column per store, tells which stores hold a row in a
  lane at all (:func:`~relayer.store.relay.holds_rows`); only those probe their share. If that
  statement fails, each store probes its share (and reports its own trouble).

A request alone in its turn is sent alone, as before.

A heartbeat must be answered within a third of a lease (the heartbeat period, at least a
second), its wait for the connection included; past that the database is silent (a stalled
server, or a network that drops packets while the connection stays open): the connection is
severed (relayer.store.severance) and the database's :class:`SilenceNotice` says so once, and
once more when a heartbeat is answered again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar
from uuid import UUID

from relayer.deadlines import Deadlines
from relayer.errors import DatabaseSilentError, StoreError
from relayer.store.connections import Session
from relayer.store.relay import Beat, RelayStore, heartbeats, holds_rows
from relayer.tasks import cancel_all, fail_all

logger = logging.getLogger(__name__)

T = TypeVar("T")
Members = tuple[list[str], int]


def next_tick(interval: float, now: float) -> float:
    """Seconds from ``now`` to the next multiple of ``interval`` (more than 0, at most
    ``interval``): timers of the same interval that wait this long end together, whenever
    they started, and none waits longer than its interval."""
    if interval <= 0:
        return 0.0
    return max((math.floor(now / interval) + 1) * interval - now, 0.0)


class SilenceNotice:
    """What a worker says about a database that stopped answering: one warning when its
    heartbeats go unanswered, one line when one is answered again (per database: the
    heartbeats of all its stores tell it). Called on the event loop's thread."""

    def __init__(self, label: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label  # user@host:port/dbname
        self._clock = clock
        self.since: float | None = None  # silent since (the clock's time)

    def silent(self, store: str, exc: DatabaseSilentError, waited: float) -> None:
        """A heartbeat of ``store`` got no answer in ``waited`` seconds."""
        if self.since is not None:
            return
        self.since = self._clock() - waited
        logger.warning(
            "PostgreSQL at %s answered nothing for %.0f s (%s): the server is stalled or "
            "overloaded, or the network drops packets while the connection stays open. Batches "
            "there roll back, nothing is counted against rows, and after a lease without a "
            "heartbeat the worker stops sending its lanes until it answers; check the server "
            "(pg_stat_activity, locks, disk, checkpoints) and the network between this worker "
            "and it",
            self.label,
            waited,
            exc,
            extra={"action": "database_stall", "store": store},
        )

    def answered(self, store: str) -> None:
        """A heartbeat of ``store`` was answered: a silence (if one was said) is over."""
        since, self.since = self.since, None
        if since is None:
            return
        logger.info(
            "PostgreSQL at %s answers again after %.0f s",
            self.label,
            self._clock() - since,
            extra={"action": "database_stall_over", "store": store},
        )


# The least time a heartbeat is given before the database counts as silent: under a lease of a
# few seconds a third of it is a busy machine's hiccup, not a silence.
LEAST_SILENCE = 1.0


def answer_within(beats: list[Beat]) -> float:
    """How long heartbeats may wait for an answer: the heartbeat period (a third of a
    lease) of the shortest lease among their stores, and at least LEAST_SILENCE."""
    period = min(Deadlines.of(beat.store.store.lease_duration).heartbeat for beat in beats)
    return max(period, LEAST_SILENCE)


class Housekeeping:
    """Batches the heartbeats and idle probes of the stores of one database that are asked
    for in the same event-loop turn, on ``session`` (their shared housekeeping session).
    ``prepare``: keep each store's heartbeat statement prepared on the connection (not behind
    a transaction pooler, whose server connections change between transactions)."""

    def __init__(self, session: Session, *, prepare: bool, label: str = "") -> None:
        self.session = session
        self.prepare = prepare
        self.silence = SilenceNotice(label or session.store.name)
        self._beats: list[tuple[Session, Beat, asyncio.Future[Members]]] = []
        self._probes: dict[str, tuple[RelayStore, list[asyncio.Future[bool]]]] = {}
        # Stores whose last heartbeat failed: they beat alone until one succeeds.
        self._alone: set[str] = set()
        self._tasks: set[asyncio.Future[None]] = set()
        # Round trips that carried more than one store (read by tests and diagnostics).
        self.batches = 0

    async def heartbeat(
        self, session: Session, store: RelayStore, member: str, token: UUID
    ) -> Members:
        """``store``'s heartbeat (RelayStore.heartbeat) on ``session`` (the store's view of the
        shared session, whose errors name the store), with those of the other stores asked
        for in this turn."""
        beat = Beat(store, member, token)
        name = store.store.name
        try:
            if name in self._alone:
                result = await self._beat_alone(session, beat)
            else:
                loop = asyncio.get_running_loop()
                future: asyncio.Future[Members] = loop.create_future()
                if not self._beats:
                    loop.call_soon(self._flush_beats)
                self._beats.append((session, beat, future))
                result = await future
        except DatabaseSilentError as exc:
            self.silence.silent(name, exc, answer_within([beat]))
            raise
        self.silence.answered(name)
        return result

    async def holds_rows(self, store: RelayStore) -> bool:
        """Whether ``store`` holds a row in any lane, asked with the other stores that ask in
        this turn (True if that could not be asked: the store then probes its share)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        if not self._probes:
            loop.call_soon(self._flush_probes)
        self._probes.setdefault(store.store.name, (store, []))[1].append(future)
        return await future

    def _flush_beats(self) -> None:
        waiting, self._beats = self._beats, []
        self._keep(self._send_beats(waiting))

    def _flush_probes(self) -> None:
        waiting, self._probes = self._probes, {}
        self._keep(self._send_probes(waiting))

    def _keep(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "batched housekeeping failed unexpectedly",
                exc_info=task.exception(),
                extra={"action": "housekeeping_failed"},
            )

    async def _send_beats(
        self, waiting: list[tuple[Session, Beat, asyncio.Future[Members]]]
    ) -> None:
        if len(waiting) == 1:
            session, beat, future = waiting[0]
            await _settle(future, self._beat_alone(session, beat))
            return
        beats = [beat for _, beat, _ in waiting]
        try:
            async with self.session.connection(
                "heartbeats", urgent=True, within=answer_within(beats)
            ) as conn:
                results = await heartbeats(conn, beats, prepare=self.prepare)
        except DatabaseSilentError as exc:  # one by one would wait as long again each
            for _, _, future in waiting:
                if not future.done():
                    future.set_exception(exc)
            return
        except StoreError as exc:
            logger.debug("batched heartbeats failed, sending them one by one: %s", exc)
            for session, beat, future in waiting:
                await _settle(future, self._beat_alone(session, beat))
            return
        except BaseException as exc:
            fail_all([future for _, _, future in waiting], exc)
            raise
        self.batches += 1
        for (_, _, future), result in zip(waiting, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def _beat_alone(self, session: Session, beat: Beat) -> Members:
        name = beat.store.store.name
        try:
            within = answer_within([beat])
            async with session.connection("heartbeat", urgent=True, within=within) as conn:
                result = await beat.store.heartbeat(
                    conn, beat.member, beat.token, prepare=self.prepare
                )
        except StoreError:
            self._alone.add(name)
            raise
        self._alone.discard(name)
        return result

    async def _send_probes(
        self, waiting: dict[str, tuple[RelayStore, list[asyncio.Future[bool]]]]
    ) -> None:
        if len(waiting) == 1:  # alone: its own probe answers as well
            found = [True]
        else:
            stores = [store for store, _ in waiting.values()]
            try:
                async with self.session.connection("probe idle stores") as conn:
                    found = await holds_rows(conn, stores)
                self.batches += 1
            except StoreError as exc:
                logger.debug("asking idle stores for rows failed, each probes its share: %s", exc)
                found = [True] * len(stores)
            except BaseException as exc:
                fail_all([future for _, pending in waiting.values() for future in pending], exc)
                raise
        for (_, pending), holds in zip(waiting.values(), found, strict=True):
            for future in pending:
                if not future.done():
                    future.set_result(holds)

    async def close(self) -> None:
        """Cancel what is still being sent (the last store of the database left)."""
        await cancel_all(self._tasks)


async def _settle(future: asyncio.Future[T], work: Awaitable[T]) -> None:
    try:
        result = await work
    except StoreError as exc:
        if not future.done():
            future.set_exception(exc)
        return
    except BaseException as exc:
        fail_all([future], exc)
        raise
    if not future.done():
        future.set_result(result)
