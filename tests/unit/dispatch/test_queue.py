"""MemoryQueue: due order, enqueue order on ties, future jobs, keyed jobs and re-schedules."""

from relayer.dispatch import MemoryQueue


def keys(jobs: list) -> list:  # type: ignore[type-arg]
    return [job.key for job in jobs]


def test_claims_due_jobs_oldest_due_first() -> None:
    queue: MemoryQueue[str] = MemoryQueue("q")
    queue.schedule("late", 5.0)
    queue.schedule("early", 1.0)
    queue.schedule("middle", 3.0)
    assert keys(queue.claim(10.0, 10)) == ["early", "middle", "late"]


def test_equal_due_times_go_in_enqueue_order() -> None:
    queue: MemoryQueue[int] = MemoryQueue()
    for key in (7, 3, 9, 1):
        queue.schedule(key, 2.0)
    assert keys(queue.claim(2.0, 10)) == [7, 3, 9, 1]


def test_future_jobs_are_never_claimed() -> None:
    queue: MemoryQueue[str] = MemoryQueue()
    queue.schedule("now", 1.0)
    queue.schedule("later", 1.5)
    assert queue.due_count(1.0) == 1
    assert keys(queue.claim(1.0, 10)) == ["now"]
    assert queue.claim(1.4999, 10) == []
    assert queue.next_due() == 1.5
    assert keys(queue.claim(1.5, 10)) == ["later"]


def test_claim_respects_the_limit_and_due_count_its_cap() -> None:
    queue: MemoryQueue[int] = MemoryQueue()
    for key in range(10):
        queue.schedule(key, float(key))
    assert queue.due_count(4.0) == 5
    assert queue.due_count(4.0, limit=3) == 3
    assert keys(queue.claim(4.0, 2)) == [0, 1]
    assert queue.due_count(4.0) == 3
    assert len(queue) == 8


def test_a_waiting_key_keeps_the_earlier_due_time() -> None:
    queue: MemoryQueue[str] = MemoryQueue()
    assert queue.schedule("lane", 10.0)
    assert not queue.schedule("lane", 20.0)  # later: ignored
    assert queue.schedule("lane", 2.0)  # earlier (a NOTIFY): moves
    assert len(queue) == 1
    assert queue.next_due() == 2.0
    [job] = queue.claim(2.0, 5)
    assert job.due == 2.0
    assert queue.claim(100.0, 5) == []


def test_moving_earlier_keeps_the_place_among_equal_times() -> None:
    queue: MemoryQueue[str] = MemoryQueue()
    queue.schedule("first", 9.0)
    queue.schedule("second", 1.0)
    queue.schedule("first", 1.0)  # enqueued before "second": goes first at equal times
    assert keys(queue.claim(1.0, 5)) == ["first", "second"]


def test_a_running_key_is_never_claimed_twice() -> None:
    queue: MemoryQueue[str] = MemoryQueue()
    queue.schedule("lane", 0.0)
    [job] = queue.claim(0.0, 5)
    assert queue.is_running("lane")
    assert queue.schedule("lane", 0.0)  # remembered for after the running job
    assert queue.schedule("lane", -1.0)
    assert not queue.schedule("lane", 3.0)
    assert queue.due_count(10.0) == 0
    assert queue.claim(10.0, 5) == []
    queue.finish(job)
    [again] = queue.claim(10.0, 5)
    assert again.key == "lane" and again.due == -1.0


def test_finishing_wakes_listeners_only_with_a_pending_schedule() -> None:
    queue: MemoryQueue[str] = MemoryQueue()
    calls: list[str] = []
    queue.listen(lambda: calls.append("wake"))
    queue.schedule("a", 0.0)
    assert calls == ["wake"]
    [job] = queue.claim(0.0, 1)
    queue.finish(job)
    assert calls == ["wake"]
    queue.schedule("a", 0.0)
    [job] = queue.claim(0.0, 1)
    queue.schedule("a", 5.0)
    queue.finish(job)
    assert calls == ["wake", "wake", "wake"]
    assert not queue.schedule("a", 7.0)  # no move: no wake-up
    assert len(calls) == 3


def test_discard_drops_waiting_and_pending_jobs() -> None:
    queue: MemoryQueue[str] = MemoryQueue()
    queue.schedule("a", 0.0)
    queue.schedule("b", 0.0)
    assert queue.due_count(0.0) == 2
    assert queue.discard("a")
    assert queue.due_count(0.0) == 1
    assert not queue.discard("a")
    [job] = queue.claim(0.0, 1)
    queue.schedule("b", 0.0)
    assert queue.discard("b")
    queue.finish(job)
    assert len(queue) == 0 and queue.next_due() is None


def test_many_reschedules_stay_consistent() -> None:
    queue: MemoryQueue[int] = MemoryQueue()
    for round_number in range(50):
        for key in range(100):
            queue.schedule(key, 1000.0 - round_number - key * 0.001)
    assert len(queue) == 100
    assert queue.due_count(2000.0) == 100
    claimed = queue.claim(2000.0, 1000)
    assert keys(claimed) == list(range(99, -1, -1))


def test_keys_are_the_waiting_running_and_rescheduled_ones() -> None:
    queue: MemoryQueue[int] = MemoryQueue()
    queue.schedule(1, 1.0)
    queue.schedule(2, 9.0)  # not due yet: still a key with a job
    queue.schedule(3, 1.0)
    (running,) = queue.claim(1.0, 1)
    assert running.key == 1
    queue.schedule(1, 2.0)  # pending behind its running job
    assert queue.keys() == {1, 2, 3}
    queue.finish(running)
    assert queue.keys() == {1, 2, 3}
    queue.discard(3)
    assert queue.keys() == {1, 2}


def test_take_claims_the_named_waiting_keys_due_by_the_time_given() -> None:
    queue: MemoryQueue[int] = MemoryQueue()
    queue.schedule(1, 5.0)  # not due by 4.0: left waiting
    queue.schedule(2, 3.0)
    queue.schedule(3, 4.0)
    queue.schedule(4, 1.0)  # due, but not asked for
    (running,) = queue.claim(1.0, 1)
    assert running.key == 4
    assert queue.due_count(3.5) == 1  # key 2
    taken = queue.take([3, 2, 1, 4, 9], due_by=4.0)  # 4 runs, 9 has no job
    assert [(job.key, job.due) for job in taken] == [(3, 4.0), (2, 3.0)]
    assert queue.is_running(2) and queue.is_running(3)
    assert queue.due_count(10.0) == 1  # only key 1 waits: taken jobs are not counted twice
    assert keys(queue.claim(10.0, 10)) == [1]
    queue.schedule(2, 0.0)  # while taken it is running: pending, as for a claimed job
    assert queue.claim(10.0, 10) == []
    queue.finish(taken[1])
    assert keys(queue.claim(10.0, 10)) == [2]


def test_holds_is_true_while_a_key_waits_or_runs() -> None:
    queue: MemoryQueue[str] = MemoryQueue()
    assert not queue.holds("a")
    queue.schedule("a", 9.0)
    assert queue.holds("a")
    (job,) = queue.take(["a"], due_by=9.0)
    assert queue.holds("a")
    queue.finish(job)
    assert not queue.holds("a")
