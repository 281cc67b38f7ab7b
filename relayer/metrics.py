"""Prometheus metrics of one Worker (the ``metrics`` extra); docs/observability.md lists them.

Recording costs the relay almost nothing: counters are the worker's own ``StoreStats`` fields,
read when Prometheus scrapes, and the two histograms are plain bucket arrays updated once per
batch (``Histogram``, no prometheus_client on the hot path). Gauges are read at scrape time from
the worker's membership and dispatch group, except the backlog (pending rows, oldest age and
parked keys per lane), which a loop refreshes every ``interval`` seconds on a connection of its
own, for the lanes this worker owns only: summed over workers it covers each lane once, and the
cluster reads each lane once per interval however many workers run.

``WorkerMetrics`` owns a ``CollectorRegistry`` of its own (two workers in one process never
collide) and can serve it over HTTP from the event loop, so every scrape reads the worker's
state on the thread that changes it. Only this module imports prometheus_client, lazily.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from relayer.connection import connect
from relayer.errors import RelayerError, StoreError, UsageError, install_command
from relayer.redact import redact
from relayer.relay import Scan
from relayer.sql import queries_for

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from relayer.worker import StoreRuntime, Worker

logger = logging.getLogger(__name__)

BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
# Up to this many ids, observe_ages reads every id's timestamp for the histogram's sum; above
# it, evenly spaced ones (about SUM_SAMPLE / 2).
SUM_SAMPLE = 64
# Up to this many ids are recorded one by one (cheaper than a search per bucket).
FEW_IDS = 4
_INSTALL_HINT = install_command("metrics")


class Histogram:
    """Fixed buckets, updated on the event loop, exported by ``WorkerMetrics`` at scrape time."""

    __slots__ = ("_floors", "_floors_at", "bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(bound) for bound in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket (not cumulative); last: +Inf
        self.count = 0
        self.total = 0.0
        self._floors_at = -1
        self._floors: list[str] = []

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def observe_ages(self, ids: Sequence[str], now_ms: int) -> None:
        """Record, for each UUIDv7 of ``ids`` (ascending canonical text), its age in seconds at
        ``now_ms``.

        Ages fall as ids rise, so each bucket's count is one binary search: O(buckets * log n)
        per batch instead of a search per row; the sum still reads each id's timestamp once.
        """
        count = len(ids)
        if not count:
            return
        if count <= FEW_IDS:  # a batch of many lanes with a row or two each: no search
            for text in ids:
                self.observe((now_ms - _written_ms(text)) / 1000)
            return
        if self._floors_at != now_ms:  # the lanes of one batch share its millisecond
            self._floors_at = now_ms
            self._floors = [
                # ids written at or after this are at most the bound old
                _uuid7_floor(max(now_ms - int(bound * 1000), 0))
                for bound in self.bounds
            ]
        at_most_previous = 0
        for index, floor in enumerate(self._floors):
            at_most = count - bisect_left(ids, floor)
            self.counts[index] += at_most - at_most_previous
            at_most_previous = at_most
        self.counts[-1] += count - at_most_previous
        self.count += count
        self.total += (count * now_ms - _written_sum(ids)) / 1000

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs ending with +Inf, as Prometheus exposes them."""
        pairs: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            pairs.append((_go_float(bound), running))
        return pairs


def _written_ms(text: str) -> int:
    # The 48-bit millisecond timestamp is the first 12 hex digits (a dash after 8).
    return int(text[:8] + text[9:13], 16)


def _written_sum(ids: Sequence[str]) -> float:
    """The sum of the write times of ``ids`` (ascending): exact for up to SUM_SAMPLE ids; for
    more, integrated (trapezoids) over evenly spaced ids, exact when the writes were evenly
    spread. Parsing every id cost more than the rest of a row's bookkeeping."""
    count = len(ids)
    if count <= SUM_SAMPLE:
        return sum([_written_ms(text) for text in ids])
    stride = count // (SUM_SAMPLE // 2)
    positions = [*range(0, count - 1, stride), count - 1]
    values = [_written_ms(ids[position]) for position in positions]
    total = (values[0] + values[-1]) / 2
    for index in range(1, len(positions)):
        width = positions[index] - positions[index - 1]
        total += (values[index] + values[index - 1]) / 2 * width
    return total


def _uuid7_floor(ms: int) -> str:
    """The smallest UUIDv7 text written at millisecond ``ms`` (compares like the UUIDs)."""
    return f"{ms >> 16 & 0xFFFFFFFF:08x}-{ms & 0xFFFF:04x}-0000-0000-000000000000"


def _go_float(bound: float) -> str:
    """A bucket bound as Prometheus spells it ("0.5", "1.0", "+Inf")."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


def batch_duration_histogram() -> Histogram:
    return Histogram(BATCH_BUCKETS)


def write_to_ack_histogram() -> Histogram:
    return Histogram(LATENCY_BUCKETS)


@dataclass(frozen=True, slots=True)
class LaneBacklog:
    """One lane's backlog (lane None: rows without an ordering key)."""

    lane: int | None
    rows: int
    oldest_age_seconds: float
    parked: int = 0
    parked_for_operator: int = 0

    @property
    def label(self) -> str:
        return "unordered" if self.lane is None else str(self.lane)


async def read_backlog(
    conn: psycopg.AsyncConnection[Any], runtime: StoreRuntime, lanes: Sequence[int]
) -> tuple[LaneBacklog, ...]:
    """The backlog of ``lanes``; unordered rows too when lane 0 is among them (one reporter)."""
    queries = queries_for(runtime.store.names)
    cursor = await conn.execute(queries["metrics_lane_backlog"], {"lanes": list(lanes)})
    found = [
        LaneBacklog(int(lane), int(rows), float(age), int(parked), int(waiting))
        for lane, rows, age, parked, waiting in await cursor.fetchall()
    ]
    if 0 in lanes:
        cursor = await conn.execute(queries["metrics_unordered_backlog"])
        row = await cursor.fetchone()
        if row is not None:
            found.append(LaneBacklog(None, int(row[0]), float(row[1])))
    return tuple(found)


def require_prometheus() -> None:
    """Raise a UsageError naming the extra when prometheus_client is not installed."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError(
            "metrics need the prometheus-client package, which is not installed; install "
            f"relayer's 'metrics' extra ({_INSTALL_HINT})"
        ) from None


class WorkerMetrics:
    """The Prometheus view of one Worker: ``registry``, ``render()``, ``serve()``, ``run()``."""

    def __init__(self, worker: Worker, *, interval: float = 5.0) -> None:
        require_prometheus()
        from prometheus_client import CollectorRegistry

        if interval <= 0:
            raise UsageError(f"the metrics interval must be > 0 seconds, not {interval}")
        self.worker = worker
        self.interval = interval
        self.backlog: dict[str, tuple[LaneBacklog, ...]] = {}
        self.refresh_errors: dict[str, int] = dict.fromkeys(worker.runtimes, 0)
        self.registry: CollectorRegistry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._connections: dict[str, psycopg.AsyncConnection[Any]] = {}
        self._server: asyncio.Server | None = None

    def render(self) -> bytes:
        """The text exposition of every metric (call it on the worker's event loop)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    async def serve(self, host: str, port: int) -> int:
        """Answer ``GET /metrics`` on ``host:port`` until ``run`` ends; returns the port."""
        try:
            self._server = await asyncio.start_server(self._answer, host, port)
        except OSError as exc:
            raise RelayerError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; choose another "
                "--metrics-port or --metrics-host"
            ) from exc
        bound = int(self._server.sockets[0].getsockname()[1])
        logger.info(
            "metrics on http://%s:%s/metrics", host, bound, extra={"action": "metrics_serve"}
        )
        return bound

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh the backlog every ``interval`` until ``stop``; then close the server."""
        try:
            while not stop.is_set():
                await self.refresh()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval)
        finally:
            await self.close()

    async def refresh(self) -> None:
        """Read the backlog of the lanes each store's membership gives this worker now."""
        for name, runtime in self.worker.runtimes.items():
            lanes = sorted(runtime.membership.lanes)
            if not lanes:
                self.backlog[name] = ()
                continue
            try:
                conn = self._connections.get(name)
                if conn is None or conn.closed:
                    conn = await connect(runtime.store, purpose=f"{name}:metrics")
                    self._connections[name] = conn
                self.backlog[name] = await read_backlog(conn, runtime, lanes)
            except (psycopg.Error, OSError, StoreError) as exc:
                self.refresh_errors[name] += 1
                await self._drop(name)
                logger.warning(
                    "metrics: reading the backlog of store %s failed: %s",
                    name,
                    redact(str(exc)),
                    extra={"action": "metrics_refresh_failed", "store": name},
                )

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for name in list(self._connections):
            await self._drop(name)

    async def _drop(self, name: str) -> None:
        conn = self._connections.pop(name, None)
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A minimal HTTP/1.1 exchange: one request, one response, then close."""
        from prometheus_client import CONTENT_TYPE_LATEST

        try:
            async with asyncio.timeout(10):
                request = (await reader.readline()).split()
                while (await reader.readline()).strip():
                    pass  # request headers: nothing in them changes the answer
                method, path = [*request, b"", b""][:2]
                if method not in (b"GET", b"HEAD"):
                    status, body, kind = b"405 Method Not Allowed", b"", "text/plain"
                elif path.split(b"?")[0] in (b"/metrics", b"/"):
                    status, body, kind = b"200 OK", self.render(), CONTENT_TYPE_LATEST
                elif path.split(b"?")[0] == b"/healthz":
                    # Answered from the worker's own event loop: an answer means it is alive.
                    status, body, kind = b"200 OK", b"ok\n", "text/plain"
                elif path.split(b"?")[0] == b"/readyz":
                    ready, reason = self.worker.readiness()
                    status = b"200 OK" if ready else b"503 Service Unavailable"
                    body, kind = reason.encode() + b"\n", "text/plain"
                else:
                    status, body, kind = (
                        b"404 Not Found",
                        b"see /metrics, /healthz or /readyz\n",
                        "text/plain",
                    )
                head = (
                    b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind.encode()
                    + b"\r\nContent-Length: " + str(len(body)).encode()
                    + b"\r\nConnection: close\r\n\r\n"
                )  # fmt: skip
                writer.write(head if method == b"HEAD" else head + body)
                await writer.drain()
        except (TimeoutError, OSError):
            pass  # the scraper went away; nothing to tell it
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class _Collector:
    """Builds every metric family from the worker's state at scrape time."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # the families are built per scrape; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        worker = self.metrics.worker
        info = GaugeMetricFamily(
            "relayer_worker_info", "This worker's member id.", labels=["member"]
        )
        info.add_metric([worker.member], 1)
        yield info
        yield from self._store_families(worker)
        yield from self._dispatch_families(worker)

    def _store_families(self, worker: Worker) -> Iterator[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        def counter(name: str, text: str, *labels: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, text, labels=["store", *labels])

        def gauge(name: str, text: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=["store", *labels])

        sent = counter("relayer_messages_sent", "Rows acknowledged by the broker and deleted.")
        failed = counter("relayer_messages_failed", "Failed head rows (each parked its key).")
        gave_up = counter(
            "relayer_messages_gave_up", "Failed rows whose key now waits for an operator."
        )
        recovered = counter(
            "relayer_unordered_recovered",
            "Unordered rows older than unordered_grace that this worker sent and deleted.",
        )
        recovery_failed = counter(
            "relayer_unordered_recovery_failed", "Failed attempts to send recovered rows."
        )
        scans = counter("relayer_lane_scans", "Lane scans by how they ended.", "result")
        errors = counter("relayer_backlog_refresh_errors", "Failed backlog refreshes.")
        batch = HistogramMetricFamily(
            "relayer_batch_duration_seconds",
            "Lane batches: lock, read, send, record outcomes and commit.",
            labels=["store"],
        )
        latency = HistogramMetricFamily(
            "relayer_write_to_ack_seconds",
            "Per row, from its write (UUIDv7 time) to the commit of its acknowledged delete.",
            labels=["store"],
        )
        pending = gauge("relayer_pending_rows", "Rows waiting in owned lanes.", "lane")
        oldest = gauge(
            "relayer_oldest_pending_age_seconds", "Age of each owned lane's head row.", "lane"
        )
        parked = gauge("relayer_parked_keys", "Parked keys in owned lanes.", "waiting")
        owned = gauge("relayer_owned_lanes", "Lanes this worker's membership owns.")
        members = gauge("relayer_live_members", "Live members of the store's cluster.")
        for name, runtime in worker.runtimes.items():
            stats = runtime.stats
            sent.add_metric([name], stats.sent)
            failed.add_metric([name], stats.failed)
            gave_up.add_metric([name], stats.gave_up)
            recovered.add_metric([name], runtime.maintenance.recovered)
            recovery_failed.add_metric([name], runtime.maintenance.recovery_failed)
            for scan in Scan:
                scans.add_metric([name, scan.value], stats.by_scan.get(scan.value, 0))
            errors.add_metric([name], self.metrics.refresh_errors.get(name, 0))
            for family, histogram in (
                (batch, stats.batch_seconds),
                (latency, stats.write_to_ack_seconds),
            ):
                family.add_metric([name], histogram.buckets(), histogram.total)
            lanes = runtime.membership.lanes
            waiting_retry = waiting_operator = 0
            for lane in self.metrics.backlog.get(name, ()):
                if (0 if lane.lane is None else lane.lane) not in lanes:
                    continue  # handed over since the refresh: its new owner reports it
                pending.add_metric([name, lane.label], lane.rows)
                oldest.add_metric([name, lane.label], lane.oldest_age_seconds)
                waiting_retry += lane.parked - lane.parked_for_operator
                waiting_operator += lane.parked_for_operator
            parked.add_metric([name, "retry"], waiting_retry)
            parked.add_metric([name, "operator"], waiting_operator)
            owned.add_metric([name], len(lanes))
            members.add_metric([name], len(runtime.membership.members))
        yield from (sent, failed, gave_up, recovered, recovery_failed, scans, errors)
        yield from (batch, latency)
        yield from (pending, oldest, parked, owned, members)

    def _dispatch_families(self, worker: Worker) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        jobs = CounterMetricFamily(
            "relayer_dispatch_jobs", "Jobs (lane scans) started per queue.", labels=["queue"]
        )
        share = GaugeMetricFamily(
            "relayer_dispatch_share", "Share of all started jobs.", labels=["queue"]
        )
        configured = GaugeMetricFamily(
            "relayer_dispatch_configured_share", "The policy's promised share.", labels=["queue"]
        )
        running = GaugeMetricFamily(
            "relayer_dispatch_running_jobs", "Jobs running now.", labels=["queue"]
        )
        waiting = GaugeMetricFamily(
            "relayer_dispatch_oldest_due_age_seconds",
            "How long the oldest due job has waited for a slot.",
            labels=["queue"],
        )
        gate = GaugeMetricFamily(
            "relayer_dispatch_gate",
            "The cluster gate's last answer (1 for the current state).",
            labels=["queue", "state"],
        )
        for queue in worker.group.telemetry():
            jobs.add_metric([queue.queue], queue.served)
            share.add_metric([queue.queue], queue.share)
            if queue.configured_share is not None:
                configured.add_metric([queue.queue], queue.configured_share)
            running.add_metric([queue.queue], queue.running)
            waiting.add_metric([queue.queue], queue.oldest_due_age)
            if queue.gate is not None:
                gate.add_metric([queue.queue, queue.gate.value], 1)
        yield from (jobs, share, configured, running, waiting, gate)
