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
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar
from uuid import UUID

from relayer.errors import StoreError
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


class Housekeeping:
    """Batches the heartbeats and idle probes of the stores of one database that are asked
    for in the same event-loop turn, on ``session`` (their shared housekeeping session).
    ``prepare``: keep each store's heartbeat statement prepared on the connection (not behind
    a transaction pooler, whose server connections change between transactions)."""

    def __init__(self, session: Session, *, prepare: bool) -> None:
        self.session = session
        self.prepare = prepare
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
        if store.store.name in self._alone:
            return await self._beat_alone(session, beat)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Members] = loop.create_future()
        if not self._beats:
            loop.call_soon(self._flush_beats)
        self._beats.append((session, beat, future))
        return await future

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
        try:
            async with self.session.connection("heartbeats", urgent=True) as conn:
                results = await heartbeats(
                    conn, [beat for _, beat, _ in waiting], prepare=self.prepare
                )
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
            async with session.connection("heartbeat", urgent=True) as conn:
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
