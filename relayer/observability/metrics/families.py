"""The metric families of one worker snapshot, built on the exporter's rendering thread.

Every name follows Prometheus' conventions, which ``promtool check metrics`` checks: counters
end in ``_total`` (prometheus_client appends it), units are in the names (``_seconds``), info
metrics end in ``_info`` and are 1. docs/observability.md lists them all.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from typing import TYPE_CHECKING

from relayer import __version__
from relayer.observability.metrics.snapshot import StoreSnapshot, WorkerSnapshot

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.metrics_core import Metric


def build_info() -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    info = GaugeMetricFamily(
        "relayer_build_info",
        "1, labelled with relayer's version and the Python that runs it.",
        labels=["version", "python_version", "python_implementation"],
    )
    info.add_metric([__version__, platform.python_version(), platform.python_implementation()], 1)
    yield info


def worker_families(snapshot: WorkerSnapshot) -> Iterator[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    info = GaugeMetricFamily("relayer_worker_info", "This worker's member id.", labels=["member"])
    info.add_metric([snapshot.member], 1)
    yield info
    yield from store_families(snapshot.stores)
    yield from dispatch_families(snapshot)


def store_families(stores: tuple[StoreSnapshot, ...]) -> Iterator[Metric]:
    """Every store's families, labelled by store: counters, histograms, then gauges."""
    yield from _store_counters(stores)
    yield from _store_histograms(stores)
    yield from _store_gauges(stores)


def _counter(name: str, text: str, *labels: str) -> CounterMetricFamily:
    from prometheus_client.core import CounterMetricFamily

    return CounterMetricFamily(name, text, labels=["store", *labels])


def _gauge(name: str, text: str, *labels: str) -> GaugeMetricFamily:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, text, labels=["store", *labels])


def _store_counters(stores: tuple[StoreSnapshot, ...]) -> Iterator[Metric]:
    sent = _counter("relayer_messages_sent", "Rows acknowledged by the broker and deleted.")
    failed = _counter("relayer_messages_failed", "Failed head rows (each parked its key).")
    gave_up = _counter(
        "relayer_messages_gave_up", "Failed rows whose key now waits for an operator."
    )
    recovered = _counter(
        "relayer_unordered_recovered",
        "Unordered rows older than unordered_grace that this worker sent and deleted.",
    )
    recovery_failed = _counter(
        "relayer_unordered_recovery_failed", "Failed attempts to send recovered rows."
    )
    scans = _counter("relayer_lane_scans", "Lane scans by how they ended.", "result")
    errors = _counter("relayer_backlog_refresh_errors", "Failed backlog refreshes.")
    for store in stores:
        name = store.name
        sent.add_metric([name], store.sent)
        failed.add_metric([name], store.failed)
        gave_up.add_metric([name], store.gave_up)
        recovered.add_metric([name], store.recovered)
        recovery_failed.add_metric([name], store.recovery_failed)
        for result, count in store.scans:
            scans.add_metric([name, result], count)
        errors.add_metric([name], store.refresh_errors)
    yield from (sent, failed, gave_up, recovered, recovery_failed, scans, errors)


def _store_histograms(stores: tuple[StoreSnapshot, ...]) -> Iterator[Metric]:
    from prometheus_client.core import HistogramMetricFamily

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
    for store in stores:
        for family, histogram in (
            (batch, store.batch_seconds),
            (latency, store.write_to_ack_seconds),
        ):
            family.add_metric([store.name], list(histogram.buckets), histogram.total)
    yield from (batch, latency)


def _store_gauges(stores: tuple[StoreSnapshot, ...]) -> Iterator[Metric]:
    pending = _gauge("relayer_pending_rows", "Rows waiting in owned lanes.")
    oldest = _gauge(
        "relayer_oldest_pending_age_seconds", "Age of the oldest head row of the owned lanes."
    )
    pending_lanes = _gauge("relayer_pending_lanes", "Owned lanes with at least one waiting row.")
    lane_pending = _gauge(
        "relayer_lane_pending_rows",
        "Rows waiting in the owned lanes whose head row is oldest (--metrics-top-lanes).",
        "lane",
    )
    lane_oldest = _gauge(
        "relayer_lane_oldest_pending_age_seconds",
        "Head row age of the owned lanes whose head row is oldest (--metrics-top-lanes).",
        "lane",
    )
    parked = _gauge("relayer_parked_keys", "Parked keys in owned lanes.", "waiting")
    owned = _gauge("relayer_owned_lanes", "Lanes this worker's membership owns.")
    members = _gauge("relayer_live_members", "Live members of the store's cluster.")
    ahead = _gauge(
        "relayer_partitions_ahead_seconds",
        "How far ahead of the database clock the newest partition reaches (partitioned stores; "
        "from the worker leading the cleanup).",
    )
    for store in stores:
        name, backlog = store.name, store.backlog
        pending.add_metric([name], backlog.rows)
        oldest.add_metric([name], backlog.oldest_age_seconds)
        pending_lanes.add_metric([name], backlog.pending_lanes)
        for lane in store.top:
            lane_pending.add_metric([name, lane.label], lane.rows)
            lane_oldest.add_metric([name, lane.label], lane.oldest_age_seconds)
        parked.add_metric([name, "retry"], backlog.parked_retry)
        parked.add_metric([name, "operator"], backlog.parked_operator)
        owned.add_metric([name], store.owned_lanes)
        members.add_metric([name], store.live_members)
        if store.partitions_ahead_seconds is not None:
            ahead.add_metric([name], store.partitions_ahead_seconds)
    yield from (pending, oldest, pending_lanes, lane_pending, lane_oldest, parked, owned, members)
    yield ahead


def dispatch_families(snapshot: WorkerSnapshot) -> Iterator[Metric]:
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
    for queue in snapshot.queues:
        jobs.add_metric([queue.queue], queue.served)
        share.add_metric([queue.queue], queue.share)
        if queue.configured_share is not None:
            configured.add_metric([queue.queue], queue.configured_share)
        running.add_metric([queue.queue], queue.running)
        waiting.add_metric([queue.queue], queue.oldest_due_age)
        if queue.gate is not None:
            gate.add_metric([queue.queue, queue.gate.value], 1)
    yield from (jobs, share, configured, running, waiting, gate)
