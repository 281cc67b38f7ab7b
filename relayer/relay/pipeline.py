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

The store's ``Routing`` names each row's transport and what it is handed to (transports without
``publish_batch`` are driven through ``publish``, one awaitable per message), and ``classify``
says what any error of a send or an acknowledgement means: the row's fault (its key stops here
and is parked), the broker's (the transport's rows wait, no attempt counted) or a cancellation.

When the relay traces (relayer.relay.trace), the report also times the sampled rows: when each
was handed over and when it settled, so that their send spans can be made once the batch's
outcome is known.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence

from relayer.store import LaneRows, RowFailure
from relayer.transports.base import BatchPublisher, Transport
from relayer.transports.routing import Fault, PreparationError, Routing, Verdict, classify

# Row states (a bytearray per batch: one byte a row).
UNSENT = 0
IN_FLIGHT = 1
ACKED = 2
FAILED = 3


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


class BatchSender:
    """Publishes the rows ``indexes`` of one batch through the store's ``routing``; see the
    module docstring for the rules."""

    def __init__(
        self,
        rows: LaneRows,
        indexes: Sequence[int],
        routing: Routing,
        *,
        admit_until: float,
        wait_until: float,
        clock: Callable[[], float] = time.monotonic,
        report: SendReport | None = None,
    ) -> None:
        self.rows = rows
        self.indexes = indexes
        self.routing = routing
        self.admit_until = admit_until
        self.wait_until = wait_until
        self.clock = clock
        self.report = report if report is not None else SendReport(len(rows))
        self._timed = self.report.timed
        self._handed = 0
        self._settled = 0
        self._stopped_keys: set[str] = set()
        # Transports found unreachable in this batch (by name -> why): their rows wait.
        self._down: dict[str, Verdict] = {}
        # Per transport name of this batch: the transport, or why its rows cannot be sent; what
        # its rows are handed to; whether some name could not be resolved.
        self._transports: dict[str | None, Transport | Verdict] = {}
        self._publishers: dict[str | None, BatchPublisher] = {}
        self._unresolved = False
        # Row -> the next row of its key, published once the row is acknowledged.
        self._waiting: dict[int, int] = {}
        # Row -> the next row of its key, pipelined behind it once the row itself goes.
        self._riders: dict[int, int] = {}
        self._ready: list[int] = []
        # Per (transport name, destination) not usable now: why (the broker's fault when its
        # broker cannot be reached: then no attempt is counted).
        self._unusable: dict[tuple[str | None, str], Verdict] = {}
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
                if self._ready and self._admitting():
                    # Rows freed by acknowledgements settled during the publish itself (a
                    # transport may settle within publish_batch): they go now, not after a wait
                    # for a wake-up that already came.
                    continue
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
        self._resolve(set(names))
        single = len(self._transports) == 1
        pairs = (
            {(names[0], destination) for destination in set(destinations)}
            if single and indexes
            else set(zip(names, destinations, strict=True))
        )
        for name, destination in sorted(pairs, key=str):
            await self._check_destination(name, destination)
        gapless = all(
            not isinstance(transport, Verdict) and transport.pipelines_within_key
            for transport in self._transports.values()
        )
        if gapless and single and len(pairs) == 1:
            # The common case: one transport, one destination, gapless: every row goes now
            # (or, if that destination cannot be used, each key stops at its first row).
            self._ready = list(indexes)
        else:
            self._order_within_keys(gapless)

    def _resolve(self, names: set[str | None]) -> None:
        """The transport of each transport name of the batch, or why there is none."""
        routing = self.routing
        for name in names:
            try:
                transport = routing.transport(name)
            except PreparationError as exc:
                self._transports[name] = classify(exc)
                self._unresolved = True
                continue
            self._transports[name] = transport
            self._publishers[name] = routing.publisher(transport)

    async def _check_destination(self, name: str | None, destination: str) -> None:
        """Learn whether ``destination`` of transport ``name`` keeps per-key order (asked once
        per store and remembered); if not, or if that cannot be told, why."""
        transport = self._transports[name]
        if isinstance(transport, Verdict):
            return
        if (transport.name, destination) in self.routing.destinations:
            return
        if transport.name in self._down:
            self._unusable[(name, destination)] = self._down[transport.name]
            return
        try:
            await self.routing.require_ordered(transport, destination)
        except Exception as exc:  # a plug-in's bug too: it must park only these rows' keys
            # (a TimeoutError here is the lookup's own, never the batch deadline: that
            # reaches this as a cancellation)
            verdict = classify(exc)
            if verdict.fault is Fault.BROKER:  # not the rows' fault
                self._down.setdefault(transport.name, verdict)
            self._unusable[(name, destination)] = verdict

    def _order_within_keys(self, gapless: bool) -> None:
        """Which rows go now (each key's first) and which wait for their key's previous one:
        until it is acknowledged (``_waiting``), or, where the two may be pipelined, until it
        goes itself (``_riders``: a row that may ride behind one that waits goes no sooner)."""
        keys = self.rows.batch.keys
        ready = self._ready
        waiting = self._waiting
        riders = self._riders
        last_of_key: dict[str, int] = {}
        held: set[str] = set()  # keys whose last row so far waits for an earlier one
        for index in self.indexes:
            key = keys[index]
            previous = last_of_key.get(key)
            last_of_key[key] = index
            if previous is None:
                ready.append(index)
            elif gapless and self._pipelined(previous, index):
                if key in held:
                    riders[previous] = index
                else:
                    ready.append(index)
            else:
                waiting[previous] = index
                held.add(key)

    def _pipelined(self, previous: int, index: int) -> bool:
        rows = self.rows
        transport = self._transports[rows.transports[index]]
        return (
            not isinstance(transport, Verdict)
            and transport.pipelines_within_key
            and rows.transports[previous] == rows.transports[index]
            and rows.batch.destinations[previous] == rows.batch.destinations[index]
        )

    def _refused(self, index: int) -> bool:
        """Whether ``index`` cannot go (its transport or destination cannot be used): then
        its key stops here, failed or (broker unreachable) left unsent."""
        rows = self.rows
        transport = self._transports[rows.transports[index]]
        if isinstance(transport, Verdict):
            self._fail(index, transport)
            return True
        if transport.name in self._down:
            self._unavailable(index, self._down[transport.name])
            return True
        verdict = self._unusable.get((rows.transports[index], rows.batch.destinations[index]))
        if verdict is None:
            return False
        if verdict.fault is Fault.BROKER:
            self._unavailable(index, verdict)
        else:
            self._fail(index, verdict)
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
        assert not isinstance(transport, Verdict)  # such rows were refused before
        keys = self.rows.batch.keys
        stopped = self._stopped_keys
        while indexes:
            if stopped:
                indexes = [index for index in indexes if keys[index] not in stopped]
                if not indexes:
                    return
            if transport.name in self._down:
                for index in indexes:
                    self._unavailable(index, self._down[transport.name])
                return
            handed = await self._hand_over(name, transport, indexes)
            if handed is None or handed >= len(indexes):
                return
            states = self.report.states
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

    async def _hand_over(
        self, name: str | None, transport: Transport, indexes: list[int]
    ) -> int | None:
        """One ``publish_batch`` call for ``indexes``: how many it handed over, or None if it
        raised (then each of them is settled here, by ``classify``'s reading of the error)."""
        states = self.report.states
        for index in indexes:
            states[index] = IN_FLIGHT
        if self._timed is not None:
            self._time(self.report.handed, indexes)
        try:
            handed = await self._publishers[name].publish_batch(
                self.rows.batch, indexes, self._settle, self._admitting
            )
        except Exception as exc:  # raised for the call as a whole
            verdict = classify(exc)
            if verdict.fault is Fault.BROKER:  # the client is unusable now: not these rows'
                self._down.setdefault(transport.name, verdict)
                for index in indexes:
                    if states[index] == IN_FLIGHT:
                        self._unavailable(index, verdict)
            else:  # refused as a whole (a transport's choice), or a plug-in's own bug
                for index in indexes:
                    if states[index] == IN_FLIGHT:
                        self._fail(index, verdict)
            return None
        self._handed += handed
        self.report.published += handed
        return handed

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
                while following is not None:  # it goes, and the rows that ride behind it
                    self._ready.append(following)
                    following = self._riders.pop(following, None)
                    self._wake.set()
            if self._settled >= self._handed:
                self._wake.set()
            return
        self._settled += 1
        self._wake.set()
        verdict = classify(error)
        if verdict.fault is Fault.ROW:
            self._fail(index, verdict)
        elif verdict.fault is Fault.BROKER:
            transport = self._transports[self.rows.transports[index]]
            if not isinstance(transport, Verdict):
                self._down.setdefault(transport.name, verdict)
            self._unavailable(index, verdict)
        else:  # abandoned (cancelled): unsent, and its key goes no further in this batch
            states[index] = UNSENT
            self._stopped_keys.add(self.rows.batch.keys[index])

    def _fail(self, index: int, verdict: Verdict) -> None:
        report = self.report
        report.states[index] = FAILED
        report.failures[index] = (verdict.text, verdict.permanent)
        report.error_types[index] = verdict.kind
        self._stopped_keys.add(self.rows.batch.keys[index])
        if self._timed is not None and index not in report.settled:
            self._time(report.settled, (index,))

    def _unavailable(self, index: int, verdict: Verdict) -> None:
        """The row's transport cannot be used now: the row stays unsent (no attempt counted)
        and its key stops; the transport's other rows stop too (``_down``)."""
        report = self.report
        report.states[index] = UNSENT
        self._stopped_keys.add(self.rows.batch.keys[index])
        report.down[index] = verdict.text
        report.error_types[index] = verdict.kind
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
