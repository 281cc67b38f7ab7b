"""Scanning: which owned lanes have a due head, learned without taking any lock.

One read-only query per event-loop turn answers every scan that starts in it (``head``), and
one query answers for a member's whole share (``heads``: the wake-up after a poll, a reconnect
or a new share).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from relayer.relay.coalescing import Coalescer
from relayer.store import LaneHead, RelayStore


class Prober:
    """Coalesces the probes of every scan that starts in the same event-loop turn into one
    query, on one connection."""

    def __init__(self, store: RelayStore, connect: Callable[[], Any]) -> None:
        self._store = store
        self._connect = connect
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()
        self._probes: Coalescer[LaneHead] = Coalescer(self._probe)
        self.queries = 0

    async def head(self, lane: int) -> LaneHead:
        return await self._probes.get(lane)

    async def _probe(self, lanes: list[int]) -> dict[int, LaneHead]:
        heads = await self._query(lambda conn: self._store.probe(conn, lanes))
        return {head.lane: head for head in heads}

    async def heads(self, rank: int, members: int) -> list[LaneHead]:
        """The heads that hold rows in the share of the member at ``rank`` of ``members``
        (lane % members == rank), in one query."""
        return await self._query(lambda conn: self._store.probe_share(conn, rank, members))

    async def _query(
        self, run: Callable[[psycopg.AsyncConnection[Any]], Awaitable[list[LaneHead]]]
    ) -> list[LaneHead]:
        async with self._lock:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = await self._connect()
                self.queries += 1
                return await run(self._conn)
            except BaseException:
                if self._conn is not None and self._conn.broken:
                    self._conn = None
                raise

    async def close(self) -> None:
        await self._probes.close()
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
