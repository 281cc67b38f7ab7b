"""relayer.relay.WakeWindow: the lanes woken within one wake_linger share a batch transaction.

Times are plain numbers here (the store's clock, seconds); linger 0.003 as by default.
"""

from __future__ import annotations

from relayer.relay.wakeups import WakeWindow

LINGER = 0.003


def leads(lane: int) -> bool:
    return True


def never(lane: int) -> bool:
    return False


def test_the_opener_is_due_at_once_and_its_batch_takes_the_lanes_woken_after_it() -> None:
    window = WakeWindow(LINGER)
    assert window.wake(7, 10.0, lead=leads) == 10.0  # its pass and claim run meanwhile
    assert window.is_open(10.001)
    assert window.wake(3, 10.001, lead=leads) == 10.003 + LINGER  # joins: due after the end
    assert window.wake(9, 10.002, lead=never) == 10.003 + LINGER
    # The opener's scan asks once when its window ends, waits, then finds them gathered.
    assert window.opened_by(7) == 10.003
    assert window.opened_by(7) is None
    assert window.take_gathered([7]) == []  # nothing is gathered before the end was waited
    window.waited(10.003)
    assert window.take_gathered([7]) == [3, 9]
    assert window.take_gathered([7]) == []  # taken once


def test_a_lane_woken_again_within_the_window_it_opened_waits_for_its_end() -> None:
    window = WakeWindow(LINGER)
    window.wake(7, 10.0, lead=leads)
    assert window.wake(7, 10.002, lead=leads) == 10.003
    window.waited(10.003)
    assert window.take_gathered([]) == []


def test_a_window_whose_first_lane_cannot_lead_serves_every_lane_at_its_end() -> None:
    # The first lane is held after an outage, or a scan of it waits or runs already: no lane
    # rides on its batch, so each is due at the end and none is gathered.
    window = WakeWindow(LINGER)
    assert window.wake(7, 10.0, lead=never) == 10.003
    assert window.wake(3, 10.001, lead=leads) == 10.003
    assert window.opened_by(7) is None
    window.waited(10.003)
    assert window.take_gathered([]) == []


def test_a_window_that_ended_gathers_its_joiners_when_the_next_one_opens() -> None:
    # The opener's scan came late (a busy pool): the next notification opens a new window, and
    # the old window's joiners go in the next batch; the old opener's wait gathers nothing of
    # the new window.
    window = WakeWindow(LINGER)
    window.wake(7, 10.0, lead=leads)
    window.wake(3, 10.001, lead=leads)
    assert window.wake(5, 10.010, lead=leads) == 10.010
    window.wake(4, 10.011, lead=leads)  # joins the new window
    old_end = window.opened_by(7)
    assert old_end == 10.003
    window.waited(old_end)
    assert window.take_gathered([7]) == [3]
    assert window.opened_by(5) == 10.013
    window.waited(10.013)
    assert window.take_gathered([5]) == [4]


def test_the_batch_leaves_its_own_lanes_out_of_the_gathered_ones() -> None:
    window = WakeWindow(LINGER)
    window.wake(1, 10.0, lead=leads)
    for lane in (2, 3, 4):
        window.join(lane)
    window.waited(10.003)
    assert window.take_gathered([1, 3]) == [2, 4]
    assert window.take_gathered([]) == []


def test_probed_lanes_join_the_open_window_like_notified_ones() -> None:
    window = WakeWindow(LINGER)
    window.wake(1, 10.0, lead=leads)
    assert window.join(6) == 10.003 + LINGER
    window.waited(10.003)
    assert window.take_gathered([1]) == [6]


def test_no_linger_opens_no_window() -> None:
    window = WakeWindow(0.0)
    assert window.wake(7, 10.0, lead=leads) == 10.0
    assert not window.is_open(10.0)
    assert window.wake(3, 10.0, lead=leads) == 10.0
    assert window.opened_by(7) is None
    assert window.take_gathered([]) == []


def test_an_opener_that_left_the_share_opens_nothing() -> None:
    window = WakeWindow(LINGER)
    window.wake(7, 10.0, lead=leads)
    window.keep(frozenset({1, 2, 3}))
    assert window.opened_by(7) is None
