"""A bound on what a transport has under way (requests, messages), and the wait for room
below it: the backpressure ``publish_batch`` applies before it hands over one more row."""

from __future__ import annotations

import asyncio


class Gate:
    """How many are under way, and waiting for room below ``limit``. On the event loop."""

    __slots__ = ("_room", "busy", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.busy = 0
        self._room = asyncio.Event()

    def full(self) -> bool:
        return self.busy >= self.limit

    async def enter(self) -> None:
        while self.busy >= self.limit:
            self._room.clear()
            await self._room.wait()
        self.busy += 1

    def leave(self) -> None:
        self.busy -= 1
        self._room.set()
