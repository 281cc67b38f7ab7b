"""The idle stores of one database, polled together: one statement a round for all of them.

A store whose wake-ups can be lost (``notify = "after_commit"``: a writer's process may die
between its commit and its wake-up) must be polled every ``poll_interval`` while idle, never
less often, so that such a row waits at most that long. Polled each on its own, 200 idle stores
would cost the worker 200 timers, tasks and probes a second. Here an idle store waits in its
database's ``IdleWatch`` instead: one timer per poll interval asks every waiting store whether
it holds a row, in one statement (:func:`~relayer.store.relay.holds_rows`, a column a store),
and wakes only the stores that do. A store that waits costs nothing between rounds.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from relayer.errors import StoreError
from relayer.store.connections import Session
from relayer.store.housekeeping import next_tick
from relayer.store.relay import RelayStore, holds_rows
from relayer.tasks import cancel_all

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Round:
    """The stores waiting for rows at one poll interval, by name, and their timer."""

    waiting: dict[str, tuple[RelayStore, asyncio.Future[bool]]] = field(default_factory=dict)
    timer: asyncio.Future[None] | None = None


class IdleWatch:
    """Polls the idle stores of one database together on ``session`` (its housekeeping
    session): see the module docstring."""

    def __init__(self, session: Session, *, prepare: bool) -> None:
        self.session = session
        # The statement of a round is kept prepared (not behind a transaction pooler): the
        # same idle stores are asked in the same order round after round, and planning one
        # subquery per store each time cost the server more than running them.
        self.prepare = prepare
        self._rounds: dict[float, _Round] = {}
        self.rounds = 0  # statements sent (tests and diagnostics)

    def waiting(self, interval: float) -> int:
        """How many stores wait in the round of ``interval`` (tests and diagnostics)."""
        round_ = self._rounds.get(interval)
        return 0 if round_ is None else len(round_.waiting)

    async def wait_for_rows(
        self, store: RelayStore, interval: float, longest: float, stop: asyncio.Event
    ) -> bool:
        """Wait until a round (every ``interval`` seconds, on the multiples of it) finds a row
        in one of ``store``'s lanes (True), or ``longest`` seconds have passed or ``stop`` is
        set (False). A round that cannot ask the database answers True: the store then probes
        on its own and reports its trouble."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        name = store.store.name
        round_ = self._rounds.setdefault(interval, _Round())
        round_.waiting[name] = (store, future)
        if round_.timer is None or round_.timer.done():
            round_.timer = asyncio.ensure_future(self._run(interval, round_))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((future, stopped), timeout=longest, return_when="FIRST_COMPLETED")
        finally:
            stopped.cancel()
            if round_.waiting.get(name, (None, None))[1] is future:
                del round_.waiting[name]
        return future.done() and not future.cancelled() and future.result()

    async def _run(self, interval: float, round_: _Round) -> None:
        loop = asyncio.get_running_loop()
        while round_.waiting:
            await asyncio.sleep(next_tick(interval, loop.time()))
            waiting = sorted(
                (entry for entry in round_.waiting.values() if not entry[1].done()),
                key=lambda entry: entry[0].store.name,
            )
            if not waiting:
                continue
            found = await self._ask([store for store, _ in waiting])
            for (_, future), holds in zip(waiting, found, strict=True):
                if holds and not future.done():
                    future.set_result(True)
        if self._rounds.get(interval) is round_:
            del self._rounds[interval]

    async def _ask(self, stores: list[RelayStore]) -> list[bool]:
        try:
            async with self.session.connection("poll idle stores") as conn:
                found = await holds_rows(conn, stores, prepare=self.prepare)
        except StoreError as exc:
            logger.debug("polling idle stores failed, each probes its share: %s", exc)
            return [True] * len(stores)
        self.rounds += 1
        return found

    async def close(self) -> None:
        """Stop the rounds (the last store of the database left)."""
        await cancel_all([r.timer for r in self._rounds.values() if r.timer is not None])
        self._rounds.clear()
