"""The Redis transport's XADDs: queued, written in one pipeline per event-loop turn, answered.

The messages queued in one turn of the event loop (a batch's ready rows, typically) go to the
server as one pipeline (not a transaction: each XADD stands alone) on a connection of the
pool; the answers come back in order and settle each message. Several pipelines may be in
flight at once, each on its own connection: a key never has two rows in flight (the relay
waits for a key's answer before its next row), so their order does not matter.

Also here: the copy refused while an earlier copy of the same message still waits (the
moment a stall is told, ``relayer.transports.stalls``), and the room left for more
(``max_outstanding``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from relayer.transports.base import SendError, TransportUnavailableError
from relayer.transports.publishing import Outcome
from relayer.transports.redis import outcomes
from relayer.transports.stalls import StallNotice


class _Queued:
    """One XADD, from its queueing until its answer."""

    __slots__ = ("done", "fields", "message_id", "settle", "stream")

    def __init__(
        self, stream: str, message_id: str, fields: Mapping[str, bytes | str], settle: Outcome
    ) -> None:
        self.stream = stream
        self.message_id = message_id
        self.fields = fields
        self.settle = settle
        self.done = False


class StreamWriter:
    """Writes the queued XADDs of a transport (see the module docstring)."""

    def __init__(
        self,
        *,
        maxlen: int | None,
        create_streams: bool,
        max_outstanding: int,
        notice: StallNotice,
    ) -> None:
        self.client: Any = None  # redis.asyncio.Redis, set when the transport starts
        self._maxlen = maxlen
        self._create_streams = create_streams
        self._limit = max_outstanding
        self._notice = notice
        self._queued: list[_Queued] = []
        self._waiting: dict[str, _Queued] = {}  # by message id: queued or written, unanswered
        self._flush_scheduled = False
        self._pipelines: set[asyncio.Task[None]] = set()
        self._answered_at = time.monotonic()
        self._room = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def full(self) -> bool:
        return len(self._waiting) >= self._limit

    async def room(self) -> None:
        """Wait until fewer than ``max_outstanding`` messages wait for their answer."""
        while self.full():
            self._room.clear()
            await self._room.wait()

    def refuse_copy(self, message_id: str) -> TransportUnavailableError | None:
        """The error for a copy of a message whose earlier copy still waits, else None."""
        if message_id not in self._waiting:
            return None
        self._notice.refused(len(self._waiting), self._answered_at)
        return outcomes.still_unanswered(message_id)

    def queue(
        self, stream: str, message_id: str, fields: Mapping[str, bytes | str], settle: Outcome
    ) -> None:
        """XADD ``fields`` to ``stream`` in this turn's pipeline; ``settle`` gets the answer."""
        if not self._waiting:  # nothing waited for an answer: nothing is overdue
            self._answered_at = time.monotonic()
            self._idle.clear()
        item = _Queued(stream, message_id, fields, settle)
        self._waiting[message_id] = item
        self._queued.append(item)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write this turn's XADDs as one pipeline, answered in the background."""
        self._flush_scheduled = False
        items, self._queued = self._queued, []
        if not items:
            return
        if self.client is None:  # closed meanwhile
            for item in items:
                self._settle(item, outcomes.unavailable(item.stream, ConnectionError("closed")))
            return
        pipeline = self.client.pipeline(transaction=False)
        for item in items:
            pipeline.xadd(
                item.stream,
                dict(item.fields),
                maxlen=self._maxlen,
                approximate=True,
                nomkstream=not self._create_streams,
            )
        task = asyncio.get_running_loop().create_task(self._execute(pipeline, items))
        self._pipelines.add(task)
        task.add_done_callback(self._pipelines.discard)

    async def _execute(self, pipeline: Any, items: list[_Queued]) -> None:
        try:
            results = await pipeline.execute(raise_on_error=False)
        except asyncio.CancelledError:
            for item in items:
                self._settle(item, outcomes.unavailable(item.stream, ConnectionError("closed")))
            raise
        except Exception as exc:  # the connection, not the rows: every one goes again
            for item in items:
                self._settle(item, outcomes.unavailable(item.stream, exc))
            return
        for item, result in zip(items, results, strict=True):
            if isinstance(result, Exception):
                self._settle(item, outcomes.refused(result, item.stream))
            elif result is None:  # NOMKSTREAM and no such stream
                self._settle(item, SendError(outcomes.missing_stream(item.stream), retryable=False))
            else:
                self._settle(item, None)

    def _settle(self, item: _Queued, error: BaseException | None) -> None:
        if item.done:
            return
        item.done = True
        if self._waiting.get(item.message_id) is item:
            del self._waiting[item.message_id]
        if len(self._waiting) < self._limit:
            self._room.set()
        if not self._waiting:
            self._idle.set()
        if error is None:
            self._answered_at = time.monotonic()
            if self._notice.since is not None:
                self._notice.acknowledged()
        item.settle(error)

    async def settled(self, seconds: float) -> int:
        """Wait up to ``seconds`` for every message to be answered; how many still wait."""
        if self._waiting:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), max(seconds, 0.0))
        return len(self._waiting)

    async def abandon(self, error: TransportUnavailableError) -> None:
        """Stop the pipelines in flight and fail every message still waiting with ``error``."""
        for item in list(self._waiting.values()):
            self._settle(item, error)
        pipelines = list(self._pipelines)
        for task in pipelines:
            task.cancel()
        if pipelines:
            await asyncio.wait(pipelines, timeout=1.0)
