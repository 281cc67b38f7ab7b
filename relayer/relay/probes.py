"""Probes: which owned lanes have a due head, learned without taking any lock.

One read-only query per event-loop turn answers every scan that starts in it (``head``), and
one query answers for a member's whole share (``heads``: the wake-up after a poll, a reconnect
or a new share).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection

from relayer.relay.coalescing import Coalescer
from relayer.store import Connect, Connection, LaneHead, RelayStore, Session


class Prober:
    """Coalesces the probes of every scan that starts in the same event-loop turn into one
    query, on ``session`` (a worker's housekeeping connection) or a connection of its own
    (``connect`` opens it; by default an autocommit connection of the store). StoreError for
    database trouble."""

    def __init__(
        self, store: RelayStore, connect: Connect | None = None, *, session: Session | None = None
    ) -> None:
        self.statements = store
        self.session = session or Session(store.store, connect, purpose="probe")
        self._probes: Coalescer[LaneHead] = Coalescer(self._probe)
        self.queries = 0

    async def head(self, lane: int) -> LaneHead:
        return await self._probes.get(lane)

    async def _probe(self, lanes: list[int]) -> dict[int, LaneHead]:
        heads = await self._query(lambda conn: self.statements.probe(conn, lanes))
        return {head.lane: head for head in heads}

    async def heads(
        self,
        rank: int,
        members: int,
        *,
        skip: Collection[int] = (),
        lanes: range | None = None,
    ) -> list[LaneHead]:
        """The heads that hold rows in the share of the member at ``rank`` of ``members``
        (lane % members == rank), leaving out the lanes of ``skip``, in one query; only lanes
        in ``lanes`` (default: every lane)."""
        return await self._query(
            lambda conn: self.statements.probe_share(conn, rank, members, skip=skip, lanes=lanes)
        )

    async def _query(
        self, run: Callable[[Connection], Awaitable[list[LaneHead]]]
    ) -> list[LaneHead]:
        async with self.session.connection("probe lanes") as conn:
            self.queries += 1
            return await run(conn)

    async def close(self) -> None:
        await self._probes.close()
        await self.session.close()
