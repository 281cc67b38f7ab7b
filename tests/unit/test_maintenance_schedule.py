"""Which maintenance jobs a worker schedules for a store: recovery always, the cleanup only
while it owns lane 0 (each store of a fleet would otherwise cost every worker a dispatch job a
minute to find it does not lead), and recovery less often while it finds nothing."""

from __future__ import annotations

from typing import Any

from relayer.maintenance import Maintenance, Task
from relayer.settings import store_settings


def maintenance(leading: list[bool]) -> Maintenance:
    store = store_settings(name="orders", dsn="postgresql://127.0.0.1:1/none")
    pool: Any = None  # not used by scheduling
    return Maintenance(store, {}, pool, lambda: 0.0, leader=lambda: leading[0])


def scheduled(target: Maintenance) -> set[Task]:
    return {Task(job.key) for job in target.queue.claim(0.0, 10)}


def test_only_the_owner_of_lane_0_schedules_the_cleanup() -> None:
    leading = [False]
    follower = maintenance(leading)
    follower.lanes_changed()  # before start: nothing
    assert scheduled(follower) == set()
    follower.start()
    assert scheduled(follower) == {Task.RECOVER_UNORDERED}
    leading[0] = True
    follower.lanes_changed()  # it came to own lane 0
    assert scheduled(follower) == {Task.CLEANUP}
    follower.lanes_changed()  # still leading: not scheduled again
    assert scheduled(follower) == set()


def test_the_leader_schedules_both_at_start() -> None:
    leader = maintenance([True])
    leader.start()
    assert scheduled(leader) == {Task.RECOVER_UNORDERED, Task.CLEANUP}
