"""Prometheus metrics of one Worker (the ``metrics`` extra); docs/observability.md lists them.

Recording costs the relay almost nothing: counters are the relay's own ``StoreStats`` fields
and its two histograms plain bucket arrays updated once per batch (relayer.relay.stats). The backlog
(pending rows, ages, parked keys) is read every ``interval`` seconds on a connection of its own,
for the lanes this worker owns only, and summarised: totals per store plus a few lanes in
detail (``backlog``). A scrape copies the worker's state on its event loop (``snapshot``) and
renders the text on a thread of its own (``exporter``), so neither the relay nor ``/healthz``
waits for it. Only this package imports prometheus_client, lazily.

Modules: ``backlog`` (what waits), ``snapshot`` (the copy),
``families`` (metric names and help), ``exporter`` (``WorkerMetrics`` and its HTTP port).
"""

from __future__ import annotations

from relayer.observability.metrics.backlog import (
    DEFAULT_TOP_LANES,
    MAX_TOP_LANES,
    Backlog,
    LaneBacklog,
)
from relayer.observability.metrics.exporter import RENDER_THREAD, WorkerMetrics, require_prometheus

__all__ = [
    "DEFAULT_TOP_LANES",
    "MAX_TOP_LANES",
    "RENDER_THREAD",
    "Backlog",
    "LaneBacklog",
    "WorkerMetrics",
    "require_prometheus",
]
