"""What one store's relay counts: scans by result, rows sent and parked, and two histograms.

The counters are plain fields and the histograms plain bucket arrays, updated once per scan or
batch on the event loop; no prometheus_client on the hot path. Metrics and the dashboard read
them (relayer.observability.metrics copies them into a snapshot when Prometheus scrapes); the
relay never imports them.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from relayer.relay.results import Scan, ScanResult

BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
# Up to this many ids, observe_ages reads every id's timestamp for the histogram's sum; above
# it, evenly spaced ones (about SUM_SAMPLE / 2).
SUM_SAMPLE = 64
# Up to this many ids are recorded one by one (cheaper than a search per bucket).
FEW_IDS = 4


class Histogram:
    """Fixed buckets, updated on the event loop, copied by ``WorkerMetrics`` at scrape time."""

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


@dataclass(slots=True)
class StoreStats:
    """Counters of one store in this worker (read by status displays and metrics)."""

    sent: int = 0
    failed: int = 0
    gave_up: int = 0
    batches: int = 0
    rollbacks: int = 0
    scans: int = 0
    by_scan: dict[str, int] = field(default_factory=dict)
    last_error: str = ""
    # Updated once per batch, exported by relayer.observability.metrics when Prometheus scrapes.
    batch_seconds: Histogram = field(default_factory=batch_duration_histogram)
    write_to_ack_seconds: Histogram = field(default_factory=write_to_ack_histogram)

    def record(self, result: ScanResult) -> None:
        """Count one lane scan (its acknowledged rows' ages: ``observe_acked``, per batch)."""
        self.scans += 1
        name = result.scan.value  # an enum's value is a descriptor call: asked once
        self.by_scan[name] = self.by_scan.get(name, 0) + 1
        if result.scan is Scan.SENT:
            self.batches += 1
            self.sent += result.sent
            self.failed += result.failed
            self.gave_up += result.gave_up
        elif result.scan in (Scan.FAILED, Scan.UNAVAILABLE):
            self.rollbacks += 1
            self.last_error = result.detail

    def observe_acked(self, results: Iterable[ScanResult], *, now_ms: int | None = None) -> None:
        """Record the write-to-ack age (at ``now_ms``, default now) of every row a batch
        transaction's lanes had acknowledged, in one pass over the batch (each lane's ids
        ascend: sorting their concatenation merges runs), not one per lane."""
        acked = [message_id for result in results for message_id in result.acked]
        if acked:
            acked.sort()
            if now_ms is None:
                now_ms = time.time_ns() // 1_000_000
            self.write_to_ack_seconds.observe_ages(acked, now_ms)
