"""The batch-wise latency histogram against a row-by-row reference."""

from __future__ import annotations

import random
from uuid import UUID

import pytest

from relayer.ids import uuid7_time_ms
from relayer.metrics import LATENCY_BUCKETS, Histogram


def uuid_at(ms: int, tail: int) -> UUID:
    return UUID(int=ms << 80 | 0x7 << 76 | 0b10 << 62 | tail)


def test_observe_ages_matches_one_observation_per_row() -> None:
    rng = random.Random(7)
    now_ms = 1_700_000_000_000
    batched, reference = Histogram(LATENCY_BUCKETS), Histogram(LATENCY_BUCKETS)
    for _ in range(50):
        # Ages from the future (clock skew) to an hour, often right on a bucket's bound.
        ages = [rng.choice([-3, 0, 5, 10, 250, 1000, 7_000, 3_600_000, rng.randrange(900_000)])]
        ages += [rng.randrange(-5, 2_000_000) for _ in range(rng.randrange(40))]
        ids = sorted(uuid_at(now_ms - age, rng.getrandbits(62)) for age in ages)
        batched.observe_ages([str(value) for value in ids], now_ms)
        for value in ids:
            reference.observe((now_ms - uuid7_time_ms(value)) / 1000)
    assert batched.counts == reference.counts
    assert batched.count == reference.count
    assert abs(batched.total - reference.total) < 1e-6 * max(reference.total, 1)


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
