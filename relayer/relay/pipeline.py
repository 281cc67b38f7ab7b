"""The send pipeline of one batch (one or more lanes): per-row outcomes, per-key order.

Rows are handed to their transports in id order, in runs: every row that may go now goes in one
``publish_batch`` call per transport, and the outcomes come back through ``settle``. A key's next
row goes in the same run as its previous one only when both go to the same destination of a
transport whose failures are gapless (``pipelines_within_key``); otherwise it waits for the
previous acknowledgement and goes in a later run. Keys never wait for each other. A failed row
stops its key for the rest of the batch; a transport that cannot be reached stops its own rows
(other transports' rows go on). Admission of new runs stops at ``admit_until``;
acknowledgements are awaited until ``wait_until``; whatever is still unresolved then is left
alone (kept in the outbox and sent again later).

When the relay traces (relayer.tracing), the report also times the sampled rows: when each was
handed over and when it settled, so that their send spans can be made once the batch's outcome
is known.

Transports without ``publish_batch`` are driven through ``publish``, one awaitable per message
(``PerMessage``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from typing import cast

from relayer.destinations import DestinationCache, PreparationError
from relayer.errors import TransportError
from relayer.store import LaneRows, RowFailure
from relayer.transports.base import BatchPublisher, PerMessage, SendError, Transport

# Row states (a bytearray per batch: one byte a row).
UNSENT = 0
IN_FLIGHT = 1
ACKED = 2
FAILED = 3

# The transport of each distinct transport name of a batch, or why there is none.
Resolve = Callable[[str | None], Transport]


class SendReport:
    """Per-row results of one batch, and why sending stopped early (if it did).

    ``timed``: rows whose hand-over and settle times (``time.time_ns()``) are recorded in
    ``handed`` and ``settled`` (the sampled rows of a traced batch; None: none)."""

    __slots__ = (
        "cut_short",
        "down",
        "error_types",
        "failures",
        "handed",
        "published",
        "settled",
        "states",
        "timed",
    )

    def __init__(self, size: int, timed: Collection[int] | None = None) -> None:
        self.states = bytearray(size)
        self.failures: dict[int, tuple[str, bool]] = {}  # row -> (error, permanent)
        self.published = 0
        self.cut_short = False
        # Rows left unsent because their transport could not be reached: row -> the error.
        self.down: dict[int, str] = {}
        # Failed or unavailable row -> the exception type's qualified name (for traces).
        self.error_types: dict[int, str] = {}
        self.timed = timed or None
        self.handed: dict[int, int] = {}
        self.settled: dict[int, int] = {}

    def outcomes(self, rows: LaneRows, indexes: Sequence[int]) -> tuple[list[int], list[int]]:
        """Of ``indexes`` (id order), the rows to delete and the failed heads to park: per key,
        the acknowledged prefix, then the first failure. Later rows of a key are kept even if
        acknowledged (they are resent after it)."""
        states = self.states
        if states.count(ACKED) == len(indexes):
            return list(indexes), []
        keys = rows.batch.keys
        acked: list[int] = []
        failed: list[int] = []
        stopped: set[str] = set()
        for index in indexes:
            key = keys[index]
            if key in stopped:
                continue
            state = states[index]
            if state == ACKED:
                acked.append(index)
                continue
            stopped.add(key)
            if state == FAILED:
                failed.append(index)
        return acked, failed

    def failure(self, rows: LaneRows, index: int) -> RowFailure:
        error, permanent = self.failures[index]
        return RowFailure(rows.lanes[index], rows.batch.ids[index], error, permanent)


def publisher_of(transport: Transport) -> BatchPublisher:
    """What the pipeline hands rows to: the transport itself if it publishes in batches.

    A transport publishes in batches if it has ``publish_batch``. That is asked with
    ``hasattr``, not ``isinstance`` against the runtime-checkable protocol: the protocol
    check looks up every member each time, 4-9 µs a batch against 0.1 µs."""
    if hasattr(transport, "publish_batch"):
        return cast(BatchPublisher, transport)
    return PerMessage(transport)


class BatchSender:
    """Publishes the rows ``indexes`` of one batch; see the module docstring for the rules."""

    def __init__(
        self,
        rows: LaneRows,
        indexes: Sequence[int],
        resolve: Resolve,
        destinations: DestinationCache,
        *,
        admit_until: float,
        wait_until: float,
        clock: Callable[[], float] = time.monotonic,
        report: SendReport | None = None,
    ) -> None:
        self.rows = rows
        self.indexes = indexes
        self.resolve = resolve
        self.destinations = destinations
        self.admit_until = admit_until
        self.wait_until = wait_until
        self.clock = clock
        self.report = report if report is not None else SendReport(len(rows))
        self._timed = self.report.timed
        self._handed = 0
        self._settled = 0
        self._stopped_keys: set[str] = set()
        # Transports found unreachable in this batch (-> their error and its type): their rows
        # wait.
        self._down: dict[str, tuple[str, str]] = {}
        # Per transport name of this batch: the transport, or why its rows cannot be sent; what
        # its rows are handed to; whether some name could not be resolved.
        self._transports: dict[str | None, Transport | str] = {}
        self._publishers: dict[str | None, BatchPublisher] = {}
        self._unresolved = False
        # Row -> the next row of its key, published once the row is acknowledged.
        self._waiting: dict[int, int] = {}
        self._ready: list[int] = []
        # Per (transport name, destination) not usable now: why, the error's type, and whether
        # because its broker cannot be reached (then no attempt is counted).
        self._unusable: dict[tuple[str | None, str], tuple[str, str, bool]] = {}
        self._wake = asyncio.Event()
        self._closed = False

    async def run(self) -> SendReport:
        try:
            await self._prepare()
            while True:
                if self._ready and self.clock() < self.admit_until:
                    await self._publish_ready()
                remaining = self.wait_until - self.clock()
                if self._settled >= self._handed and not self._ready:
                    break  # everything handed over is settled and nothing more can go
                if remaining <= 0 or (self._settled >= self._handed and not self._admitting()):
                    break
                # No settle can run between the checks above and this clear: only awaits
                # yield to the event loop.
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
        if self._ready and not self._admitting():
            self.report.cut_short = True
        return self.report

    def _admitting(self) -> bool:
        return self.clock() < self.admit_until

    def stop_admitting(self) -> None:
        """Admit no new row from now on (the worker is stopping); what was handed over is still
        waited for until ``wait_until``."""
        self.admit_until = min(self.admit_until, self.clock())
        self._wake.set()

    # -- preparation: transports, destinations and which rows may go at once -----------------

    async def _prepare(self) -> None:
        rows = self.rows
        indexes = self.indexes
        whole = len(indexes) == len(rows)
        names = rows.transports if whole else [rows.transports[index] for index in indexes]
        destinations = (
            rows.batch.destinations
            if whole
            else [rows.batch.destinations[index] for index in indexes]
        )
        for name in set(names):
            try:
                resolved = self.resolve(name)
            except PreparationError as exc:
                self._transports[name] = str(exc)
                self._unresolved = True
                continue
            self._transports[name] = resolved
            self._publishers[name] = publisher_of(resolved)
        single = len(self._transports) == 1
        pairs = (
            {(names[0], destination) for destination in set(destinations)}
            if single and indexes
            else set(zip(names, destinations, strict=True))
        )
        for name, destination in sorted(pairs, key=str):
            transport = self._transports[name]
            if isinstance(transport, str) or (transport.name, destination) in self.destinations:
                continue
            if transport.name in self._down:
                self._unusable[(name, destination)] = (*self._down[transport.name], True)
                continue
            try:
                await self.destinations.require_ordered(transport, destination)
            except PreparationError as exc:
                self._unusable[(name, destination)] = (str(exc), error_type(exc), False)
            except TransportError as exc:  # its broker cannot be reached: not the rows' fault
                self._down.setdefault(transport.name, (str(exc), error_type(exc)))
                self._unusable[(name, destination)] = (str(exc), error_type(exc), True)
            except Exception as exc:  # a plug-in's bug must park only these rows' keys
                # (a TimeoutError here is the lookup's own, never the batch deadline: that
                # reaches this as a cancellation)
                text = f"{type(exc).__name__}: {exc}"
                self._unusable[(name, destination)] = (text, error_type(exc), False)
        gapless = all(
            not isinstance(transport, str) and transport.pipelines_within_key
            for transport in self._transports.values()
        )
        if gapless and single and len(pairs) == 1:
            # The common case: one transport, one destination, gapless: every row goes now
            # (or, if that destination cannot be used, each key stops at its first row).
            self._ready = list(indexes)
            return
        keys = rows.batch.keys
        ready = self._ready
        waiting = self._waiting
        last_of_key: dict[str, int] = {}
        for index in indexes:
            key = keys[index]
            previous = last_of_key.get(key)
            last_of_key[key] = index
            if previous is None or (gapless and self._pipelined(previous, index)):
                ready.append(index)
            else:
                waiting[previous] = index

    def _pipelined(self, previous: int, index: int) -> bool:
        rows = self.rows
        transport = self._transports[rows.transports[index]]
        return (
            not isinstance(transport, str)
            and transport.pipelines_within_key
            and rows.transports[previous] == rows.transports[index]
            and rows.batch.destinations[previous] == rows.batch.destinations[index]
        )

    def _refused(self, index: int) -> bool:
        """Whether ``index`` cannot go (its transport or destination cannot be used): then
        its key stops here, failed or (broker unreachable) left unsent."""
        rows = self.rows
        transport = self._transports[rows.transports[index]]
        if isinstance(transport, str):
            self._fail(index, transport, _PREPARATION, permanent=False)
            return True
        if transport.name in self._down:
            self._unavailable(index, *self._down[transport.name])
            return True
        reason = self._unusable.get((rows.transports[index], rows.batch.destinations[index]))
        if reason is None:
            return False
        error, kind, unreachable = reason
        if unreachable:
            self._unavailable(index, error, kind)
        else:
            self._fail(index, error, kind, permanent=False)
        return True

    # -- publishing ------------------------------------------------------------------------

    async def _publish_ready(self) -> None:
        """Hand every ready row to its transport, in id order, one call per transport."""
        ready = sorted(self._ready)
        self._ready = []
        if self._stopped_keys or self._unusable or self._down or self._unresolved:
            keys = self.rows.batch.keys
            stopped = self._stopped_keys
            ready = [
                index for index in ready if keys[index] not in stopped and not self._refused(index)
            ]
        names = self.rows.transports
        if len(self._transports) == 1:
            groups = {next(iter(self._transports)): ready}
        else:
            groups = {}
            for index in ready:
                groups.setdefault(names[index], []).append(index)
        try:
            # One deadline for the whole run (a publish blocked on backpressure must not eat
            # the batch deadline).
            async with asyncio.timeout(max(self.wait_until - self.clock(), 0)):
                for name, indexes in groups.items():
                    await self._publish_to(name, indexes)
        except TimeoutError:
            self.report.cut_short = True
            self.admit_until = self.clock()

    async def _publish_to(self, name: str | None, indexes: list[int]) -> None:
        transport = self._transports[name]
        assert not isinstance(transport, str)  # such rows were refused before
        keys = self.rows.batch.keys
        stopped = self._stopped_keys
        publisher = self._publishers[name]
        while indexes:
            if stopped:
                indexes = [index for index in indexes if keys[index] not in stopped]
                if not indexes:
                    return
            if transport.name in self._down:
                for index in indexes:
                    self._unavailable(index, *self._down[transport.name])
                return
            states = self.report.states
            for index in indexes:
                states[index] = IN_FLIGHT
            if self._timed is not None:
                self._time(self.report.handed, indexes)
            try:
                handed = await publisher.publish_batch(
                    self.rows.batch, indexes, self._settle, self._admitting
                )
            except SendError as exc:  # refused as a whole (a transport's own choice)
                for index in indexes:
                    self._fail(index, str(exc), error_type(exc), permanent=not exc.retryable)
                return
            except TransportError as exc:  # not about these rows: the client is unusable now
                self._down.setdefault(transport.name, (str(exc), error_type(exc)))
                for index in indexes:
                    if states[index] == IN_FLIGHT:
                        self._unavailable(index, str(exc), error_type(exc))
                return
            self._handed += handed
            self.report.published += handed
            if handed >= len(indexes):
                return
            stopped_at = indexes[handed]
            if states[stopped_at] == IN_FLIGHT:
                # Not settled: the call stopped there because admission ended while it waited.
                for index in indexes[handed:]:
                    states[index] = UNSENT
                self.admit_until = min(self.admit_until, self.clock())
                self.report.cut_short = True
                return
            # It failed at once (settled already, which counted it as settled though it was
            # never handed over); the rest was not handed over: go on with it.
            self._settled -= 1
            for index in indexes[handed + 1 :]:
                states[index] = UNSENT
            indexes = indexes[handed + 1 :]

    # -- outcomes (settle runs on the event loop, possibly during publish_batch) ---------------

    def _settle(self, index: int, error: BaseException | None) -> None:
        if self._closed:
            return
        states = self.report.states
        if states[index] != IN_FLIGHT:
            return  # settled already (a transport's bug) or given up
        if self._timed is not None:
            self._time(self.report.settled, (index,))
        if error is None:
            states[index] = ACKED
            self._settled += 1
            if self._waiting:
                following = self._waiting.pop(index, None)
                if following is not None:
                    self._ready.append(following)
                    self._wake.set()
            if self._settled >= self._handed:
                self._wake.set()
            return
        self._settled += 1
        self._wake.set()
        kind = error_type(error)
        if isinstance(error, SendError):
            self._fail(index, str(error), kind, permanent=not error.retryable)
        elif isinstance(error, TransportError):
            name = self.rows.transports[index]
            transport = self._transports[name]
            if not isinstance(transport, str):
                self._down.setdefault(transport.name, (str(error), kind))
            self._unavailable(index, str(error), kind)
        elif isinstance(error, asyncio.CancelledError):
            states[index] = UNSENT
            self._stopped_keys.add(self.rows.batch.keys[index])
        else:
            self._fail(index, f"{type(error).__name__}: {error}", kind, permanent=False)

    def _fail(self, index: int, error: str, kind: str, *, permanent: bool) -> None:
        report = self.report
        report.states[index] = FAILED
        report.failures[index] = (error, permanent)
        report.error_types[index] = kind
        self._stopped_keys.add(self.rows.batch.keys[index])
        if self._timed is not None and index not in report.settled:
            self._time(report.settled, (index,))

    def _unavailable(self, index: int, error: str, kind: str) -> None:
        """The row's transport cannot be used now: the row stays unsent (no attempt counted)
        and its key stops; the transport's other rows stop too (``_down``)."""
        report = self.report
        report.states[index] = UNSENT
        self._stopped_keys.add(self.rows.batch.keys[index])
        report.down[index] = error
        report.error_types[index] = kind
        if self._timed is not None and index not in report.settled:
            self._time(report.settled, (index,))

    def _time(self, times: dict[int, int], indexes: Sequence[int]) -> None:
        """Record now as the time of the timed ones of ``indexes``."""
        timed = self._timed
        assert timed is not None
        now = time.time_ns()
        for index in indexes:
            if index in timed:
                times[index] = now


# The error type of a row whose transport name resolves to no transport.
_PREPARATION = f"{PreparationError.__module__}.{PreparationError.__qualname__}"


def error_type(error: BaseException) -> str:
    """The qualified name of ``error``'s type (OpenTelemetry's ``error.type``); for a row
    that cannot be sent as it is, its cause's (a missing topic's DestinationError, say)."""
    if isinstance(error, PreparationError) and error.__cause__ is not None:
        error = error.__cause__
    kind = type(error)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


async def send_batch(
    rows: LaneRows,
    indexes: Sequence[int],
    resolve: Resolve,
    destinations: DestinationCache,
    *,
    admit_until: float,
    wait_until: float,
    clock: Callable[[], float] = time.monotonic,
    report: SendReport | None = None,
) -> SendReport:
    """Publish the rows ``indexes`` of ``rows`` (id order within each lane; a key lives in one
    lane) and report the outcome of each (in ``report``, if given: a traced batch's)."""
    sender = BatchSender(
        rows,
        indexes,
        resolve,
        destinations,
        admit_until=admit_until,
        wait_until=wait_until,
        clock=clock,
        report=report,
    )
    return await sender.run()
