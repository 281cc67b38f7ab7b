"""Aligned timers (relayer.store.housekeeping.next_tick): a wait ends at the next multiple of
its length, so timers of one length end together, and never waits longer than its length."""

from __future__ import annotations

import pytest

from relayer.store.housekeeping import next_tick


@pytest.mark.parametrize(
    ("interval", "now", "expected"),
    [(10.0, 3.0, 7.0), (10.0, 10.0, 10.0), (10.0, 19.999, 0.001), (1.0, 0.25, 0.75)],
)
def test_a_tick_is_the_next_multiple_of_the_interval(
    interval: float, now: float, expected: float
) -> None:
    assert next_tick(interval, now) == pytest.approx(expected)


def test_timers_started_apart_end_together() -> None:
    ends = {round(now + next_tick(10.0, now), 9) for now in (100.5, 103.25, 109.75)}
    assert ends == {110.0}
