"""``WorkerMetrics``: one Worker's Prometheus registry, its HTTP endpoint and backlog refresh.

The port speaks just enough HTTP/1.1 for Prometheus and probes: ``/metrics``, ``/healthz`` and
``/readyz``, one request per connection, answered on the worker's event loop.

A scrape copies the worker's state on the event loop (relayer.observability.metrics.snapshot:
cheap and bounded) and renders the text on a thread of its own, so the event loop keeps relaying and
answering ``/healthz`` while a scrape is produced. Before, the render ran on the loop and grew
with the lane count: 0.67 s at 65,536 lanes, during which /healthz and the relay waited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from relayer.errors import RelayerError, StoreError, UsageError, install_command
from relayer.observability.metrics.backlog import (
    DEFAULT_TOP_LANES,
    MAX_TOP_LANES,
    Backlog,
    read_backlog,
)
from relayer.observability.metrics.families import build_info, worker_families
from relayer.observability.metrics.snapshot import WorkerSnapshot, take_snapshot
from relayer.observability.throttle import ThrottledLog, shape
from relayer.redact import redact

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from relayer.worker.worker import Worker

logger = logging.getLogger(__name__)

RENDER_THREAD = "relayer-metrics"  # the name of the thread that renders scrapes
# Lanes that changed hands refresh the backlog early (the totals counted the old share): the
# exporter looks this often, and refreshes at most once per EARLIEST_REFRESH.
LANE_CHECK = 0.25
EARLIEST_REFRESH = 1.0
_INSTALL_HINT = install_command("metrics")


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
    """The Prometheus view of one Worker: ``registry``, ``scrape()``, ``serve()``, ``run()``.

    :param interval: seconds between two reads of the backlog gauges (pending rows, ages,
        parked keys) from the store.
    :param top_lanes: per store, how many lanes get series of their own
        (``relayer_lane_pending_rows``): those with rows whose head row is oldest; 0 for none.
    """

    def __init__(
        self, worker: Worker, *, interval: float = 5.0, top_lanes: int = DEFAULT_TOP_LANES
    ) -> None:
        require_prometheus()
        from prometheus_client import (
            CollectorRegistry,
            GCCollector,
            PlatformCollector,
            ProcessCollector,
        )

        if interval <= 0:
            raise UsageError(f"the metrics interval must be > 0 seconds, not {interval}")
        if not 0 <= top_lanes <= MAX_TOP_LANES:
            raise UsageError(
                f"the metrics' top lanes must be from 0 to {MAX_TOP_LANES}, not {top_lanes}"
            )
        self.worker = worker
        self.interval = interval
        self.top_lanes = top_lanes
        self.backlog: dict[str, Backlog] = {}
        self._log = ThrottledLog(logger)
        self.refresh_errors: dict[str, int] = dict.fromkeys(worker.stores, 0)
        # The state the registry shows: taken on the loop by every scrape and refresh.
        self.snapshot: WorkerSnapshot | None = None
        self.registry: CollectorRegistry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, memory, fds
        PlatformCollector(registry=self.registry)  # python_info
        GCCollector(registry=self.registry)  # python_gc_*
        self._server: asyncio.Server | None = None
        self._renderer: ThreadPoolExecutor | None = None
        self._failed: set[str] = set()  # stores whose last refresh failed: no early retry

    def take_snapshot(self) -> WorkerSnapshot:
        """Copy the worker's state for the next render (call it on the worker's event loop)."""
        self.snapshot = take_snapshot(self.worker, self.backlog, self.refresh_errors)
        return self.snapshot

    def render(self) -> bytes:
        """The text exposition, rendered on the calling thread (call it on the worker's event
        loop; ``await scrape()`` renders off it)."""
        from prometheus_client import generate_latest

        self.take_snapshot()
        return generate_latest(self.registry)

    async def scrape(self) -> bytes:
        """The text exposition: the state copied on the event loop, the text rendered on the
        metrics thread (``RENDER_THREAD``) while the loop goes on."""
        from prometheus_client import generate_latest

        self.take_snapshot()
        if self._renderer is None:
            self._renderer = ThreadPoolExecutor(1, thread_name_prefix=RENDER_THREAD)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._renderer, generate_latest, self.registry)

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
            loop = asyncio.get_running_loop()
            while not stop.is_set():
                refreshed = loop.time()
                await self.refresh()
                self.take_snapshot()
                await self._until_next_refresh(stop, refreshed)
        finally:
            await self.close()

    async def _until_next_refresh(self, stop: asyncio.Event, refreshed: float) -> None:
        """Until ``interval`` after the last refresh, or earlier (EARLIEST_REFRESH at the
        soonest) once a store's lanes changed hands since its backlog was read: until then its
        totals still count its old share, so summed over workers a lane may count twice."""
        loop = asyncio.get_running_loop()
        deadline = refreshed + self.interval
        earliest = refreshed + min(self.interval, EARLIEST_REFRESH)
        while not stop.is_set():
            now = loop.time()
            if now >= deadline or (now >= earliest and self._lanes_moved()):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(LANE_CHECK, deadline - now))

    def _lanes_moved(self) -> bool:
        return any(
            name not in self._failed
            and name in self.backlog
            and self.backlog[name].lanes is not served.relay.membership.lanes
            for name, served in self.worker.stores.items()
        )

    async def refresh(self) -> None:
        """Read the backlog of the lanes each store's membership gives this worker now, on a
        batch connection of the store's database (within the worker's connection budget)."""
        for name in self.backlog.keys() - self.worker.stores.keys():
            self.backlog.pop(name, None)  # a store that left the worker
        for name, served in list(self.worker.stores.items()):  # stores join meanwhile
            lanes = served.relay.membership.lanes
            if not lanes:
                self.backlog[name] = Backlog(lanes)
                continue
            try:
                async with served.relay.pool.connection("read the backlog") as conn:
                    self.backlog[name] = await read_backlog(conn, served, lanes, self.top_lanes)
                self._failed.discard(name)
            except StoreError as exc:  # driver errors too: the pool and read_backlog translate them
                self._failed.add(name)
                self.refresh_errors[name] = self.refresh_errors.get(name, 0) + 1
                self._log.warning(
                    (name, shape(redact(str(exc)))),
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
        if self._renderer is not None:
            self._renderer.shutdown(wait=False)
            self._renderer = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await http_answer(reader, writer, self.scrape, self.worker.readiness)


# A client that has not sent its request, or read the answer, within this many seconds is
# dropped (the render in between has no such bound: its thread runs it to the end anyway).
READ_WITHIN = 10


async def http_answer(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    scrape: Callable[[], Awaitable[bytes]],
    readiness: Callable[[], tuple[bool, str]],
) -> None:
    """A minimal HTTP/1.1 exchange: one request, one response, then close."""
    from prometheus_client import CONTENT_TYPE_LATEST

    try:
        async with asyncio.timeout(READ_WITHIN):
            request = (await reader.readline()).split()
            while (await reader.readline()).strip():
                pass  # request headers: nothing in them changes the answer
        method, path = [*request, b"", b""][:2]
        path = path.split(b"?")[0]
        if method not in (b"GET", b"HEAD"):
            status, body, kind = b"405 Method Not Allowed", b"", "text/plain"
        elif path in (b"/metrics", b"/"):
            status, body, kind = b"200 OK", await scrape(), CONTENT_TYPE_LATEST
        elif path == b"/healthz":
            # Answered from the worker's own event loop: an answer means it is alive.
            status, body, kind = b"200 OK", b"ok\n", "text/plain"
        elif path == b"/readyz":
            ready, reason = readiness()
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
        async with asyncio.timeout(READ_WITHIN):
            writer.write(head if method == b"HEAD" else head + body)
            await writer.drain()
    except (TimeoutError, OSError):
        pass  # the scraper went away; nothing to tell it
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


class _Collector:
    """The worker's families from the latest snapshot, and the build info."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # the families are built per scrape; nothing to check at registration

    def collect(self) -> list[Metric]:
        families = list(build_info())
        snapshot = self.metrics.snapshot  # one reference: a scrape renders one snapshot
        if snapshot is not None:
            families.extend(worker_families(snapshot))
        return families
