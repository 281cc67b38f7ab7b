"""A copy of one Worker's state, taken on its event loop, that another thread can render.

The worker's counters, histograms and membership change on the event loop; a thread reading
them as they change could see a histogram's buckets and count from different batches, or a
dictionary that grew during iteration. Taking the copy costs O(stores + queues + detail lanes),
tens of microseconds, whatever the lane count: the backlog is already summarised (see
relayer.observability.metrics.backlog). Rendering it to text, the part whose cost grows with the
number of series, then runs on a thread of its own (relayer.observability.metrics.exporter).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relayer.dispatch.telemetry import QueueTelemetry
from relayer.observability.metrics.backlog import Backlog, LaneBacklog, owned_now
from relayer.relay.results import Scan
from relayer.relay.stats import Histogram

if TYPE_CHECKING:
    from relayer.worker.served import ServedStore
    from relayer.worker.worker import Worker


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    buckets: tuple[tuple[str, float], ...]  # cumulative (le, count), ending with +Inf
    total: float

    @classmethod
    def of(cls, histogram: Histogram) -> HistogramSnapshot:
        return cls(tuple(histogram.buckets()), histogram.total)


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    name: str
    sent: int
    failed: int
    gave_up: int
    recovered: int
    recovery_failed: int
    scans: tuple[tuple[str, int], ...]  # (result, count) for every Scan result
    refresh_errors: int
    batch_seconds: HistogramSnapshot
    write_to_ack_seconds: HistogramSnapshot
    owned_lanes: int
    live_members: int
    backlog: Backlog
    top: tuple[LaneBacklog, ...]  # the backlog's detail lanes this worker still owns
    # A partitioned store whose cleanup this worker leads: the newest partition's reach ahead
    # of the database clock (relayer.worker.maintenance.Maintenance.partitions_ahead).
    partitions_ahead_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    member: str
    stores: tuple[StoreSnapshot, ...]
    queues: tuple[QueueTelemetry, ...]


def take_snapshot(
    worker: Worker, backlog: Mapping[str, Backlog], refresh_errors: Mapping[str, int]
) -> WorkerSnapshot:
    """Copy what the metrics show of ``worker`` (call it on the worker's event loop)."""
    stores: list[StoreSnapshot] = []
    for name, served in worker.stores.items():
        lanes = served.relay.membership.lanes
        read = backlog.get(name) or Backlog(lanes)
        stores.append(_store(name, served, read, lanes, refresh_errors.get(name, 0)))
    return WorkerSnapshot(worker.member, tuple(stores), worker.group.telemetry())


def _store(
    name: str, served: ServedStore, backlog: Backlog, lanes: frozenset[int], errors: int
) -> StoreSnapshot:
    stats = served.relay.stats
    return StoreSnapshot(
        name=name,
        sent=stats.sent,
        failed=stats.failed,
        gave_up=stats.gave_up,
        recovered=served.maintenance.recovered,
        recovery_failed=served.maintenance.recovery_failed,
        scans=tuple((scan.value, stats.by_scan.get(scan.value, 0)) for scan in Scan),
        refresh_errors=errors,
        batch_seconds=HistogramSnapshot.of(stats.batch_seconds),
        write_to_ack_seconds=HistogramSnapshot.of(stats.write_to_ack_seconds),
        owned_lanes=len(lanes),
        live_members=len(served.relay.membership.members),
        backlog=backlog,
        top=tuple(owned_now(backlog, lanes)),
        partitions_ahead_seconds=served.maintenance.partitions_ahead(),
    )
