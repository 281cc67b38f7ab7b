"""Pipelined sending of one batch (one or more lanes) with per-row outcomes and per-key order.

Rows are published in id order. A key's next row is published right after its previous one
only when both go to the same destination of a transport whose failures are gapless
(``pipelines_within_key``); otherwise it waits for the previous acknowledgement. Keys never wait
for each other. A failed row stops its key for the rest of the batch; a transport that cannot be
reached stops its own rows (other transports' rows go on). Admission of new rows stops at
``admit_until``; acknowledgements are awaited until ``wait_until``; whatever is still
unresolved then is left alone (kept in the outbox and sent again later).
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from relayer.destinations import DestinationCache, PreparationError
from relayer.errors import TransportError
from relayer.store import Failure, PendingRow
from relayer.transports.base import SendError, Transport

logger = logging.getLogger(__name__)

Resolve = Callable[[PendingRow], Transport]


class State(Enum):
    UNSENT = "unsent"
    IN_FLIGHT = "in-flight"
    ACKED = "acked"
    FAILED = "failed"


@dataclass(slots=True)
class SendReport:
    """Per-row results of one batch, and why sending stopped early (if it did)."""

    states: list[State]
    failures: dict[int, Failure] = field(default_factory=dict)
    published: int = 0
    cut_short: bool = False
    # Rows left unsent because their transport could not be reached: row index -> the error.
    down: dict[int, str] = field(default_factory=dict)

    def outcomes(
        self, rows: Sequence[PendingRow]
    ) -> tuple[list[PendingRow], list[tuple[PendingRow, Failure]]]:
        """Rows to delete and failed heads to park: per key, the acknowledged prefix, then the
        first failure. Later rows of a key are kept even if acknowledged (resent after it)."""
        acked: list[PendingRow] = []
        failures: list[tuple[PendingRow, Failure]] = []
        stopped: set[str] = set()
        for index, row in enumerate(rows):
            if row.key in stopped:
                continue
            state = self.states[index]
            if state is State.ACKED:
                acked.append(row)
                continue
            stopped.add(row.key)
            if state is State.FAILED:
                failures.append((row, self.failures[index]))
        return acked, failures


class BatchSender:
    """Publishes one batch; see the module docstring for the rules."""

    def __init__(
        self,
        rows: Sequence[PendingRow],
        resolve: Resolve,
        destinations: DestinationCache,
        *,
        admit_until: float,
        wait_until: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rows = rows
        self.resolve = resolve
        self.destinations = destinations
        self.admit_until = admit_until
        self.wait_until = wait_until
        self.clock = clock
        self.report = SendReport([State.UNSENT] * len(rows))
        self._next_of_key: list[int | None] = [None] * len(rows)
        self._ready: list[int] = []
        self._stopped_keys: set[str] = set()
        # Transports found unreachable in this batch (-> their error): their rows wait for the
        # next batch.
        self._down: dict[str, str] = {}
        self._waiting_for_ack: dict[int, int] = {}  # published row -> next row of its key
        self._previous_of_key: dict[
            int, asyncio.Future[None]
        ] = {}  # pipelined row -> its predecessor's ack
        self._in_flight = 0
        self._publishing: int | None = None
        self._wake = asyncio.Event()
        self._closed = False
        last_of_key: dict[str, int] = {}
        for index, row in enumerate(rows):
            previous = last_of_key.get(row.key)
            if previous is None:
                self._ready.append(index)
            else:
                self._next_of_key[previous] = index
            last_of_key[row.key] = index

    async def run(self) -> SendReport:
        try:
            while True:
                # Returns with nothing ready, or with admission over.
                await self._publish_ready()
                remaining = self.wait_until - self.clock()
                if self._in_flight == 0 or remaining <= 0:
                    break
                # No callback can run between the state checks above and this clear: only
                # awaits yield to the event loop.
                self._wake.clear()
                try:
                    # Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation (the
                    # worker stopping) that arrives in the turn the event is set.
                    async with asyncio.timeout(remaining):
                        await self._wake.wait()
                except TimeoutError:
                    break
        finally:
            self._closed = True
        if self._ready and self._admission_over():
            self.report.cut_short = True
        return self.report

    def _admission_over(self) -> bool:
        return self.clock() >= self.admit_until

    async def _publish_ready(self) -> None:
        if not self._ready or self._admission_over():
            return
        self._publishing = None
        try:
            # One deadline for the whole run of publishes (a timer per publish costs more than
            # the publish): a publish blocked on backpressure must not eat the batch deadline.
            async with asyncio.timeout(max(self.wait_until - self.clock(), 0)):
                await self._publish_loop()
        except TimeoutError:
            if self._publishing is not None:
                self._stopped_keys.add(self.rows[self._publishing].key)
            self.report.cut_short = True
            self.admit_until = self.clock()

    async def _publish_loop(self) -> None:
        while self._ready and not self._admission_over():
            index = heapq.heappop(self._ready)
            row = self.rows[index]
            previous = self._previous_of_key.pop(index, None)
            if _known_failed(previous):
                # The predecessor already failed (its callback has not run yet): never send a
                # key's later row after an earlier one is known to have failed.
                self._stopped_keys.add(row.key)
            if row.key in self._stopped_keys:
                continue
            message = row.message
            try:
                transport = self.resolve(row)
            except PreparationError as exc:
                self._fail(index, str(exc), permanent=False)
                continue
            if transport.name in self._down:
                self._unavailable(index, transport.name, None)
                continue
            if (transport.name, message.destination) not in self.destinations:
                try:
                    await self.destinations.require_ordered(transport, message.destination)
                except PreparationError as exc:
                    self._fail(index, str(exc), permanent=False)
                    continue
                except TransportError as exc:  # its broker cannot be reached: not the row's
                    self._unavailable(index, transport.name, exc)
                    continue
                except Exception as exc:  # a plug-in's bug must park only this row's key
                    # (a TimeoutError here is the lookup's own, never the batch deadline: that
                    # reaches this loop as a cancellation)
                    self._fail(index, f"{type(exc).__name__}: {exc}", permanent=False)
                    continue
            self._publishing = index
            try:
                acknowledgement = await transport.publish(message)
            except SendError as exc:
                self._fail(index, str(exc), permanent=not exc.retryable)
                continue
            except TransportError as exc:  # not about this row: the client is unusable now
                self._unavailable(index, transport.name, exc)
                continue
            except Exception as exc:  # a plug-in's bug must park only this row's key
                self._fail(index, f"{type(exc).__name__}: {exc}", permanent=False)
                continue
            self._publishing = None
            self.report.published += 1
            self.report.states[index] = State.IN_FLIGHT
            self._in_flight += 1
            future = (
                acknowledgement
                if isinstance(acknowledgement, asyncio.Future)
                else asyncio.ensure_future(acknowledgement)
            )
            following = self._next_of_key[index]
            if following is not None:
                if self._pipelined(transport, row, self.rows[following]):
                    self._previous_of_key[following] = future
                    heapq.heappush(self._ready, following)
                else:
                    self._waiting_for_ack[index] = following
            if future.done():
                # Already acknowledged (or failed): settle now, without a loop callback.
                self._settled(index, future)
            else:
                future.add_done_callback(functools.partial(self._settled, index))

    def _pipelined(self, transport: Transport, row: PendingRow, following: PendingRow) -> bool:
        return (
            transport.pipelines_within_key
            and following.transport == row.transport
            and following.destination == row.destination
        )

    def _settled(self, index: int, done: asyncio.Future[None]) -> None:
        if self._closed:
            return
        self._in_flight -= 1
        self._wake.set()
        if done.cancelled():
            self.report.states[index] = State.UNSENT
            self._stopped_keys.add(self.rows[index].key)
            return
        error = done.exception()
        if error is None:
            self.report.states[index] = State.ACKED
            following = self._waiting_for_ack.pop(index, None)
            if following is not None:
                heapq.heappush(self._ready, following)
        elif isinstance(error, SendError):
            self._fail(index, str(error), permanent=not error.retryable)
        elif isinstance(error, TransportError):
            self._unavailable(index, self.resolve(self.rows[index]).name, error)
        else:
            self._fail(index, f"{type(error).__name__}: {error}", permanent=False)

    def _fail(self, index: int, error: str, *, permanent: bool) -> None:
        row = self.rows[index]
        self.report.states[index] = State.FAILED
        self.report.failures[index] = Failure(row.id, error, permanent)
        self._stopped_keys.add(row.key)

    def _unavailable(self, index: int, transport: str, error: Exception | None) -> None:
        """The row's transport cannot be used now: the row stays unsent (no attempt counted),
        its key stops, and so do the transport's other rows in this batch; rows of other
        transports go on."""
        self.report.states[index] = State.UNSENT
        self._stopped_keys.add(self.rows[index].key)
        if error is not None:
            self._down.setdefault(transport, str(error))
        self.report.down[index] = self._down.get(transport, f"transport {transport!r} is down")


def _known_failed(future: asyncio.Future[None] | None) -> bool:
    return (
        future is not None
        and future.done()
        and not future.cancelled()
        and future.exception() is not None
    )


async def send_batch(
    rows: Sequence[PendingRow],
    resolve: Resolve,
    destinations: DestinationCache,
    *,
    admit_until: float,
    wait_until: float,
    clock: Callable[[], float] = time.monotonic,
) -> SendReport:
    """Publish ``rows`` (id order within each lane; a key lives in one lane) and report the
    outcome of each."""
    sender = BatchSender(
        rows, resolve, destinations, admit_until=admit_until, wait_until=wait_until, clock=clock
    )
    return await sender.run()
