"""Which maintenance jobs and looks a worker plans for a store: recovery always, the cleanup
only while it owns the store's cleanup lane (each store of a fleet would otherwise cost every
worker a look or a dispatch job a minute to find it does not lead); with a housekeeping
session, looks first and no job until a look finds work."""

from __future__ import annotations

from typing import Any

from relayer.settings import store_settings
from relayer.worker.maintenance import Maintenance, Task, cleanup_lane


def maintenance(leading: list[bool], session: Any = None) -> Maintenance:
    store = store_settings(name="orders", dsn="postgresql://127.0.0.1:1/none")
    pool: Any = None  # not used by scheduling
    return Maintenance(store, {}, pool, lambda: 0.0, leader=lambda: leading[0], session=session)


def scheduled(target: Maintenance) -> set[Task]:
    return {Task(job.key) for job in target.queue.claim(0.0, 10)}


def test_only_the_owner_of_the_cleanup_lane_schedules_the_cleanup() -> None:
    leading = [False]
    follower = maintenance(leading)
    follower.lanes_changed()  # before start: nothing
    assert scheduled(follower) == set()
    follower.start()
    assert scheduled(follower) == {Task.RECOVER_UNORDERED}
    leading[0] = True
    follower.lanes_changed()  # it came to own the cleanup lane
    assert scheduled(follower) == {Task.CLEANUP}
    follower.lanes_changed()  # still leading: not scheduled again
    assert scheduled(follower) == set()


def test_the_leader_schedules_both_at_start() -> None:
    leader = maintenance([True])
    leader.start()
    assert scheduled(leader) == {Task.RECOVER_UNORDERED, Task.CLEANUP}


def test_with_a_housekeeping_session_it_looks_before_any_job() -> None:
    leading = [False]
    target = maintenance(leading, session=object())  # looks are not run here
    target.start()
    assert scheduled(target) == set()
    assert set(target.planned_looks) == {Task.RECOVER_UNORDERED}
    leading[0] = True
    target.lanes_changed()
    assert scheduled(target) == set()
    assert set(target.planned_looks) == {Task.RECOVER_UNORDERED, Task.CLEANUP}


def test_the_cleanup_lanes_of_a_fleet_spread_over_the_lanes() -> None:
    lanes = [
        cleanup_lane(
            store_settings(
                name=f"t{number:03d}",
                dsn="postgresql://127.0.0.1:1/none",
                db_schema=f"t{number:03d}",
                lanes=8,
            )
        )
        for number in range(200)
    ]
    assert all(0 <= lane < 8 for lane in lanes)
    # Two members split 8 lanes by rank (lane % 2): each leads some of the stores' cleanups.
    assert {lane % 2 for lane in lanes} == {0, 1}
    assert len(set(lanes)) == 8
