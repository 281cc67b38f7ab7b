"""The batch-wise latency histogram against a row-by-row reference."""

from __future__ import annotations

import random
from uuid import UUID

import pytest

from relayer.ids import uuid7_time_ms
from relayer.relay.results import Scan, ScanResult
from relayer.relay.stats import LATENCY_BUCKETS, SUM_SAMPLE, Histogram, StoreStats


def uuid_at(ms: int, tail: int) -> UUID:
    return UUID(int=ms << 80 | 0x7 << 76 | 0b10 << 62 | tail)


def observed(ages_ms: list[int], rng: random.Random, now_ms: int) -> tuple[Histogram, Histogram]:
    """The batch-wise histogram and a row-by-row reference after one batch of those ages."""
    batched, reference = Histogram(LATENCY_BUCKETS), Histogram(LATENCY_BUCKETS)
    ids = sorted(uuid_at(now_ms - age, rng.getrandbits(62)) for age in ages_ms)
    batched.observe_ages([str(value) for value in ids], now_ms)
    for value in ids:
        reference.observe((now_ms - uuid7_time_ms(value)) / 1000)
    return batched, reference


def test_observe_ages_matches_one_observation_per_row() -> None:
    """Bucket counts are exact for any batch; so is the sum for batches of up to SUM_SAMPLE
    rows."""
    rng = random.Random(7)
    now_ms = 1_700_000_000_000
    for _ in range(50):
        # Ages from the future (clock skew) to an hour, often right on a bucket's bound.
        ages = [rng.choice([-3, 0, 5, 10, 250, 1000, 7_000, 3_600_000, rng.randrange(900_000)])]
        ages += [rng.randrange(-5, 2_000_000) for _ in range(rng.randrange(40))]
        batched, reference = observed(ages, rng, now_ms)
        assert batched.counts == reference.counts
        assert batched.count == reference.count
        if len(ages) <= SUM_SAMPLE:
            assert abs(batched.total - reference.total) < 1e-6 * max(reference.total, 1)


def test_the_sum_of_a_large_batch_is_estimated_closely() -> None:
    """Above SUM_SAMPLE rows the sum is integrated over evenly spaced ids: within half a
    percent of the exact one for rows written at random times."""
    rng = random.Random(11)
    now_ms = 1_700_000_000_000
    for _ in range(20):
        oldest = rng.randrange(50, 60_000)
        ages = [rng.randrange(0, oldest) for _ in range(rng.randrange(SUM_SAMPLE + 1, 5_000))]
        batched, reference = observed(ages, rng, now_ms)
        assert batched.counts == reference.counts
        assert batched.total == pytest.approx(reference.total, rel=0.005)


def test_buckets_are_cumulative_and_end_with_inf() -> None:
    histogram = Histogram((0.5, 1))
    for value in (0.1, 0.5, 0.7, 3.0):
        histogram.observe(value)
    assert histogram.buckets() == [("0.5", 2), ("1.0", 3), ("+Inf", 4)]
    assert histogram.total == pytest.approx(4.3)


def test_nothing_to_observe_changes_nothing() -> None:
    histogram = Histogram(LATENCY_BUCKETS)
    histogram.observe_ages([], 0)
    assert histogram.count == 0 and sum(histogram.counts) == 0


def test_one_histogram_over_many_batches_at_the_same_and_later_milliseconds() -> None:
    """The lanes of one batch are recorded at the same millisecond (the bucket floors are
    worked out once for it), then later batches at later ones: still exact."""
    rng = random.Random(5)
    batched, reference = Histogram(LATENCY_BUCKETS), Histogram(LATENCY_BUCKETS)
    now_ms = 1_700_000_000_000
    for step in range(200):
        now_ms += rng.choice([0, 0, 0, 1, 37, 5_000])
        ages = [rng.randrange(-5, 900_000) for _ in range(rng.choice([1, 2, 5, 30]))]
        ids = sorted(uuid_at(now_ms - age, rng.getrandbits(62)) for age in ages)
        batched.observe_ages([str(value) for value in ids], now_ms)
        for value in ids:
            reference.observe((now_ms - uuid7_time_ms(value)) / 1000)
        assert batched.counts == reference.counts, step
    assert batched.count == reference.count


def test_a_batch_of_many_lanes_is_observed_once_as_if_row_by_row() -> None:
    """StoreStats.observe_acked: each lane's ids ascend, the batch's do not; the result is the
    same as observing every row on its own."""
    rng = random.Random(12)
    now_ms = 1_900_000_000_000
    lanes = [
        sorted(uuid_at(now_ms - rng.randrange(0, 120_000), rng.getrandbits(62)) for _ in range(n))
        for n in (1, 11, 0, 3, 40)
    ]
    results = [
        ScanResult(lane, Scan.SENT, 0.0, sent=len(ids), acked=tuple(str(value) for value in ids))
        for lane, ids in enumerate(lanes)
    ]
    stats = StoreStats()
    stats.observe_acked(results, now_ms=now_ms)
    reference = Histogram(LATENCY_BUCKETS)
    for ids in lanes:
        for value in ids:
            reference.observe((now_ms - uuid7_time_ms(value)) / 1000)
    assert stats.write_to_ack_seconds.counts == reference.counts
    assert stats.write_to_ack_seconds.count == 55
    assert stats.write_to_ack_seconds.total == pytest.approx(reference.total)
