"""One lane batch at a time, on real PostgreSQL, with the MemoryTransport."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from relayer.errors import FencedWriteError
from relayer.ids import uuid7
from relayer.relay.batch import LaneRelay
from relayer.relay.probes import Prober
from relayer.relay.results import Scan, after_probe
from relayer.settings import StoreSettings
from relayer.store import RelayStore
from relayer.transports.memory import MemoryTransport
from relayer.transports.routing import Routing
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import (
    BATCH_STORE,
    bodies_by_key,
    first_deliveries_in_order,
    keys_in_lane,
    parked,
    pending,
    write,
)

MEMBER = "member-a"


@pytest.fixture
async def memory() -> AsyncIterator[MemoryTransport]:
    transport = MemoryTransport("memory")
    await transport.start()
    yield transport
    await transport.close()


@pytest.fixture(params=["delete", "partitioned"])
async def relay_store(pg_dsn: str, request: pytest.FixtureRequest) -> StoreSettings:
    """A store of each storage mode (docs/storage.md): every case holds in both."""
    store = make_store(
        pg_dsn,
        **BATCH_STORE,
        storage=request.param,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    return store


async def connection(store: StoreSettings) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(store.require_dsn())


async def send_group(relay: LaneRelay, lanes: list[int]) -> Any:
    conn = await connection(relay.store)
    try:
        return await relay.send_lanes(conn, lanes)
    finally:
        await conn.close()


async def send(relay: LaneRelay, lane: int) -> Any:
    return (await send_group(relay, [lane]))[0]


async def test_batch_sends_head_first_per_key_and_deletes(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    keys = keys_in_lane(relay_store, 1, 5)
    write(relay_store, keys, per_key=8)  # 40 rows, under batch_size
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    result = await send(relay, 1)
    assert result.scan is Scan.SENT
    assert result.sent == 40
    assert pending(relay_store) == 0
    by_key = bodies_by_key(memory.received("events"))
    assert by_key == {key: list(range(8)) for key in keys}
    assert first_deliveries_in_order(memory.received("events"))
    again = await send(relay, 1)
    assert again.scan is Scan.EMPTY


class SlowFirstPublish(MemoryTransport):
    """A memory transport whose first publish takes ``delay`` seconds of the relay's clock
    (backpressure), told by advancing ``clock`` rather than by sleeping."""

    def __init__(self, name: str, clock: list[float], delay: float) -> None:
        super().__init__(name)
        self.clock = clock
        self.delay = delay
        self.calls = 0

    async def publish(self, message: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            self.clock[0] += self.delay
        return await super().publish(message)


async def test_a_lane_left_out_of_the_admission_window_is_due_again_at_once(
    pg_dsn: str,
) -> None:
    """Two lanes share a batch; a blocked publish of the first uses up the admission window,
    so the second lane's rows are never published. That lane did nothing wrong: it is due
    again at once (no backoff, nothing parked), and the next batch sends its rows."""
    store = make_store(
        pg_dsn, lanes=4, batch_size=50, lease_duration="30s",
        transports={"memory": {"type": "memory"}}, default_transport="memory",
    )  # fmt: skip
    await apply_schema(store)
    write(store, keys_in_lane(store, 1, 2))
    write(store, keys_in_lane(store, 2, 2))
    clock = [0.0]
    transport = SlowFirstPublish("memory", clock, delay=8.0)  # admission is lease/4 = 7.5 s
    await transport.start()
    relay = LaneRelay(store, Routing(store, {"memory": transport}), MEMBER, clock=lambda: clock[0])
    first, second = await send_group(relay, [1, 2])
    by_sent = sorted([first, second], key=lambda result: result.sent)
    left_out, served = by_sent
    assert served.sent == 1 and served.scan is Scan.SENT and served.next_in == 0.0
    assert left_out.sent == 0 and left_out.failed == 0
    assert left_out.scan is Scan.SENT and left_out.next_in == 0.0 and left_out.cut_short
    assert parked(store) == {}
    assert pending(store) == 3
    again = await send(relay, left_out.lane)
    assert again.sent == 2
    await transport.close()


class FailingLookup(MemoryTransport):
    """A memory transport whose destination lookups for ``bad`` raise ``error``."""

    def __init__(self, name: str, bad: str, error: Exception) -> None:
        super().__init__(name)
        self.bad, self.error = bad, error

    async def ordered_by_key(self, destination: str) -> bool:
        if destination == self.bad:
            raise self.error
        return await super().ordered_by_key(destination)


@pytest.mark.parametrize("error", [RuntimeError("plug-in bug"), TimeoutError()])
async def test_a_lookup_that_crashes_parks_only_its_key(
    relay_store: StoreSettings, error: Exception
) -> None:
    """A plug-in's bug (any exception, a TimeoutError included) in ordered_by_key parks the
    row's key; the lane's other keys are sent and deleted, the batch commits."""
    bad_key, good_key = keys_in_lane(relay_store, 1, 2)
    write(relay_store, [bad_key], destination="broken")
    write(relay_store, [good_key], per_key=2)
    transport = FailingLookup("memory", "broken", error)
    await transport.start()
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": transport}), MEMBER)
    result = await send(relay, 1)
    await transport.close()
    assert result.failed == 1 and result.sent == 2 and result.scan is Scan.SENT
    assert list(parked(relay_store)) == [bad_key]
    assert pending(relay_store) == 1  # only the bad key's row is left


async def test_an_unreachable_broker_during_a_lookup_counts_no_attempt(
    relay_store: StoreSettings,
) -> None:
    from relayer.transports.base import TransportUnavailableError

    write(relay_store, keys_in_lane(relay_store, 1, 2))
    transport = FailingLookup("memory", "events", TransportUnavailableError("broker down"))
    await transport.start()
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": transport}), MEMBER)
    for _ in range(3):
        result = await send(relay, 1)
        assert result.scan is Scan.UNAVAILABLE and result.failed == 0
    assert parked(relay_store) == {}  # no attempt counted: nothing parked, nothing given up
    assert pending(relay_store) == 2
    await transport.close()


async def test_batch_size_bounds_each_batch(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    write(relay_store, keys_in_lane(relay_store, 2, 3), per_key=40)  # 120 rows
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    sent = [(await send(relay, 2)).sent for _ in range(4)]
    assert sent == [50, 50, 20, 0]
    assert pending(relay_store) == 0


async def test_other_lanes_are_untouched(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    write(relay_store, keys_in_lane(relay_store, 0, 2))
    write(relay_store, keys_in_lane(relay_store, 3, 2))
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    await send(relay, 0)
    assert pending(relay_store) == 2


async def test_future_head_stalls_only_its_lane(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    [first, second] = keys_in_lane(relay_store, 1, 2)
    write(relay_store, [first], deliver_at=later)
    write(relay_store, [second])  # due, but behind a future head in the same lane
    write(relay_store, keys_in_lane(relay_store, 2, 1))
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    assert (await send(relay, 1)).scan is Scan.FUTURE
    assert (await send(relay, 2)).sent == 1
    assert pending(relay_store) == 2


async def test_failing_key_is_parked_and_other_keys_flow(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    bad, good = keys_in_lane(relay_store, 1, 2)
    write(relay_store, [bad, good], per_key=3)
    memory.fail_key(bad, message="broker said no")
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    result = await send(relay, 1)
    assert result.sent == 3 and result.failed == 1
    assert bodies_by_key(memory.received("events")) == {good: [0, 1, 2]}
    assert parked(relay_store) == {bad: (1, "broker said no", False)}
    assert pending(relay_store) == 3
    # More rows of both keys: the parked key waits, the other flows.
    write(relay_store, [bad, good])
    assert (await send(relay, 1)).sent == 1
    assert pending(relay_store) == 4


async def test_parked_key_retries_after_backoff_and_gives_up(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    [key] = keys_in_lane(relay_store, 0, 1)
    write(relay_store, [key], per_key=2)
    memory.fail_key(key, message="still failing")
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    await send(relay, 0)
    assert parked(relay_store)[key][:2] == (1, "still failing")
    assert (await send(relay, 0)).scan is Scan.EMPTY  # parked until retry_at
    with psycopg.connect(relay_store.require_dsn(), autocommit=True) as conn:
        conn.execute("UPDATE orders_parked SET retry_at = now() - interval '1 second'")
    await send(relay, 0)
    assert parked(relay_store)[key][0] == 2
    with psycopg.connect(relay_store.require_dsn(), autocommit=True) as conn:
        conn.execute("UPDATE orders_parked SET retry_at = now() - interval '1 second'")
    await send(relay, 0)
    assert parked(relay_store)[key] == (3, "still failing", True)  # max_attempts=3: gave up
    # After the fault is gone the key still waits for an operator.
    memory.clear_key(key)
    assert (await send(relay, 0)).scan is Scan.EMPTY
    assert pending(relay_store) == 2


async def test_retry_success_unparks_and_keeps_order(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    [key] = keys_in_lane(relay_store, 3, 1)
    write(relay_store, [key], per_key=4)
    memory.fail_next(1)
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    await send(relay, 3)
    assert key in parked(relay_store)
    with psycopg.connect(relay_store.require_dsn(), autocommit=True) as conn:
        conn.execute("UPDATE orders_parked SET retry_at = now()")
    result = await send(relay, 3)
    assert result.sent == 4
    assert parked(relay_store) == {}
    assert bodies_by_key(memory.received("events"))[key] == [0, 1, 2, 3]


async def test_permanent_error_parks_without_retry(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    [key] = keys_in_lane(relay_store, 2, 1)
    write(relay_store, [key])
    memory.fail_key(key, retryable=False, message="message too large: raise max size")
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    result = await send(relay, 2)
    assert result.gave_up == 1
    assert parked(relay_store)[key] == (1, "message too large: raise max size", True)


async def test_preparation_failures_park_with_actionable_messages(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    unknown_key, unordered_key, fine_key = keys_in_lane(relay_store, 1, 3)
    memory.declare_unordered("fanout")
    with psycopg.connect(relay_store.require_dsn(), autocommit=True) as conn:
        # A row naming a transport this worker does not have (written by another service).
        conn.execute(
            "INSERT INTO orders_outbox (id, lane, ordering_key, transport, destination, body) "
            "VALUES (%s, 1, %s, 'sqs', 'events', 'x')",
            (uuid7(), unknown_key),  # a UUIDv7, as relayer's writers make (a partition bound)
        )
    write(relay_store, [unordered_key], destination="fanout")
    write(relay_store, [fine_key])
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    result = await send(relay, 1)
    assert result.sent == 1
    reasons = parked(relay_store)
    assert "transport 'sqs' is not configured" in reasons[unknown_key][1]
    assert "does not keep per-key order" in reasons[unordered_key][1]
    # Destinations without native ordering are never cached: fixing it needs no restart.
    assert ("memory", "fanout") not in relay.routing.destinations


async def test_stalled_transport_commits_the_confirmed_prefix(
    pg_dsn: str, memory: MemoryTransport
) -> None:
    store = make_store(
        pg_dsn,
        lanes=1,
        lease_duration="2s",
        poll_interval="0.1s",
        batch_size=100,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    write(store, [f"k{index}" for index in range(10)])
    memory.stall()
    relay = LaneRelay(store, Routing(store, {"memory": memory}), MEMBER)
    batch = asyncio.ensure_future(send(relay, 0))
    await asyncio.sleep(0.2)
    memory.release(4)  # four acknowledgements arrive, the rest never do
    started = asyncio.get_running_loop().time()
    result = await batch
    elapsed = asyncio.get_running_loop().time() - started + 0.2
    assert result.sent == 4
    assert elapsed < 1.0 + 0.5  # within lease/2 (plus scheduling slack)
    assert pending(store) == 6


async def test_a_batch_the_broker_acknowledges_nothing_of_is_the_brokers_fault(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    """A silent stall: every row sent, no acknowledgement by the deadline. The lane waits as
    for an unreachable broker (UNAVAILABLE, retry_backoff), nothing is parked, no attempt."""
    write(relay_store, keys_in_lane(relay_store, 1, 3), per_key=2)
    memory.stall()
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    result = await send(relay, 1)
    assert (result.scan, result.next_in, result.failed) == (Scan.UNAVAILABLE, relay.backoff, 0)
    assert "acknowledged nothing" in result.detail
    assert parked(relay_store) == {}
    with psycopg.connect(relay_store.require_dsn()) as conn:
        row = conn.execute(f"SELECT max(attempts) FROM {relay_store.table_prefix}outbox").fetchone()
    assert row == (0,)
    assert pending(relay_store) == 6


async def test_a_stopped_relay_admits_no_new_row_and_starts_no_batch(
    relay_store: StoreSettings,
) -> None:
    """stop() during a batch: what was sent is still waited for (the confirmed prefix
    commits), nothing more is admitted; a batch asked for afterwards sends nothing."""
    keys = keys_in_lane(relay_store, 1, 2)
    write(relay_store, keys, per_key=3)
    memory = MemoryTransport("memory", pipelines_within_key=False)  # stop-and-wait per key
    await memory.start()
    memory.stall()
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    batch = asyncio.ensure_future(send(relay, 1))
    while len(memory.received("events")) < 2:  # each key's head is in flight
        await asyncio.sleep(0.01)
    relay.stop()
    memory.release()  # the heads are acknowledged; their keys' next rows are not admitted
    result = await batch
    assert result.sent == 2
    assert len(memory.received("events")) == 2
    assert pending(relay_store) == 4
    assert (await send(relay, 1)).scan is Scan.STOPPED
    assert pending(relay_store) == 4
    await memory.close()


async def test_a_lane_locked_by_another_batch_is_skipped_without_waiting(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    write(relay_store, keys_in_lane(relay_store, 1, 1))
    other = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), "member-b")
    holder = await connection(relay_store)
    tokens, rows = await other.db.lock_and_read(
        holder, [1], "member-b", __import__("uuid").uuid4(), 10
    )
    assert 1 in tokens and rows
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    result = await asyncio.wait_for(send(relay, 1), 2)
    assert result.scan is Scan.BUSY
    await holder.rollback()
    await holder.close()


async def test_stale_owner_fenced_delete_removes_nothing(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    ids = write(relay_store, keys_in_lane(relay_store, 0, 2))
    db = RelayStore(relay_store)
    import uuid

    async with await connection(relay_store) as conn:
        tokens, rows = await db.lock_and_read(conn, [0], MEMBER, uuid.uuid4(), 10)
        assert 0 in tokens and list(rows.batch.ids) == [str(id_) for id_ in ids]
        await conn.commit()
        with pytest.raises(FencedWriteError, match=r"matched 0 of 2 rows \(lease held: no\)"):
            await db.record_outcomes(
                conn,
                member=MEMBER,
                tokens={0: str(uuid.uuid4())},
                acked=rows.batch.ids,
                acked_lanes=rows.lanes,
                failures=[],
            )
        await conn.rollback()
        # The current owner's fenced delete goes through.
        tokens, _ = await db.lock_and_read(conn, [0], MEMBER, uuid.uuid4(), 10)
        assert 0 in tokens
        done = await db.record_outcomes(
            conn,
            member=MEMBER,
            tokens=tokens,
            acked=rows.batch.ids[:1],
            acked_lanes=rows.lanes[:1],
            failures=[],
        )
    assert done.deleted == 1
    assert pending(relay_store) == 1


async def test_killed_connection_mid_batch_loses_nothing(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    keys = keys_in_lane(relay_store, 2, 4)
    write(relay_store, keys, per_key=5)
    memory.stall()
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    conn = await connection(relay_store)
    batch = asyncio.ensure_future(relay.send_lanes(conn, [2]))
    await asyncio.sleep(0.2)
    with psycopg.connect(relay_store.require_dsn(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    memory.resume()
    [result] = await batch
    assert result.scan is Scan.FAILED
    assert pending(relay_store) == 20  # rolled back: everything is still there
    duplicates_before = len(memory.received("events"))
    assert duplicates_before <= relay_store.batch_size
    result = await send(relay, 2)
    assert result.sent == 20
    assert first_deliveries_in_order(memory.received("events"))


async def test_probe_is_one_query_for_lanes_scanned_together(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    write(relay_store, keys_in_lane(relay_store, 1, 1))
    later = datetime.now(UTC) + timedelta(minutes=5)
    write(relay_store, keys_in_lane(relay_store, 2, 1), deliver_at=later)
    prober = Prober(RelayStore(relay_store), lambda: connection_autocommit(relay_store))
    heads = await asyncio.gather(*(prober.head(lane) for lane in range(4)))
    assert prober.queries == 1
    assert [head.has_head for head in heads] == [False, True, True, False]
    assert heads[2].future and 200 < heads[2].due_in <= 300
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    assert after_probe(heads[0], MEMBER, relay.poll) is not None
    assert after_probe(heads[1], MEMBER, relay.poll) is None  # due: must be sent
    assert after_probe(heads[2], MEMBER, relay.poll).scan is Scan.FUTURE  # type: ignore[union-attr]
    await prober.close()


async def test_a_share_probe_leaves_out_the_lanes_it_is_told_to_skip(pg_dsn: str) -> None:
    store = make_store(
        pg_dsn, lanes=12, transports={"memory": {"type": "memory"}}, default_transport="memory"
    )
    await apply_schema(store)
    for lane in (1, 2, 5, 11):
        write(store, keys_in_lane(store, lane, 1))
    prober = Prober(RelayStore(store), lambda: connection_autocommit(store))
    try:

        async def probed(rank: int, members: int, skip: set[int]) -> list[int]:
            return [head.lane for head in await prober.heads(rank, members, skip=skip)]

        assert await probed(0, 1, set()) == [1, 2, 5, 11]
        assert await probed(0, 1, {2}) == [1, 5, 11]
        assert await probed(0, 1, {5, 7, 11}) == [1, 2]
        assert await probed(0, 1, {1, 2, 5, 11}) == []
        assert await probed(1, 2, {5}) == [1, 11]  # the odd lanes
        assert await probed(0, 1, {0}) == [1, 2, 5, 11]  # lanes past the bits are probed

        async def in_range(lanes: range) -> list[int]:
            return [head.lane for head in await prober.heads(0, 1, lanes=lanes)]

        assert await in_range(range(0, 12)) == [1, 2, 5, 11]
        assert await in_range(range(2, 11)) == [2, 5]  # from first, up to but not end
        assert await in_range(range(3, 5)) == []
        assert await in_range(range(5, 6)) == [5]
    finally:
        await prober.close()


async def test_a_share_probe_finds_the_head_past_parked_keys_as_a_lane_probe_does(
    pg_dsn: str,
) -> None:
    """A share probe takes a lane's first row as its head unless that row's key is parked and
    not due: then it looks past the parked keys, as the probe of named lanes does."""
    store = make_store(
        pg_dsn, lanes=8, transports={"memory": {"type": "memory"}}, default_transport="memory"
    )
    await apply_schema(store)
    later = datetime.now(UTC) + timedelta(minutes=5)
    retry = {1: "now() + interval '1 hour'", 2: "now() + interval '1 hour'", 3: "now() - "
             "interval '1 second'", 4: "NULL"}  # fmt: skip
    for lane, retry_at in retry.items():
        [parked_key] = keys_in_lane(store, lane, 1, prefix=f"parked{lane}-")
        write(store, [parked_key], per_key=2)  # the lane's first rows, of a parked key
        with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO {store.table_prefix}parked (ordering_key, lane, head_id, "
                f"attempts, last_error, retry_at) SELECT ordering_key, lane, id, 1, 'refused', "
                f"{retry_at} FROM {store.table_prefix}outbox WHERE ordering_key = %s "
                "ORDER BY id LIMIT 1",
                (parked_key,),
            )
        if lane != 2:  # lane 2 holds only the parked key's rows: nothing to send
            write(store, keys_in_lane(store, lane, 1, prefix=f"next{lane}-"), deliver_at=later)
    write(store, keys_in_lane(store, 5, 1, prefix="plain"))
    prober = Prober(RelayStore(store), lambda: connection_autocommit(store))
    try:
        share = {head.lane: head for head in await prober.heads(0, 1)}
        named = await asyncio.gather(*(prober.head(lane) for lane in range(8)))
        # Lane 1: past the parked key, the next row (future-dated). Lane 2: none. Lane 3: the
        # parked key is due for its retry: its row is the head. Lane 4: given up (parked for
        # good), so the next row. Lane 5: a plain row.
        assert sorted(share) == [1, 3, 4, 5]
        assert [(share[lane].future, share[lane].due_in > 200) for lane in (1, 3, 4, 5)] == [
            (True, True),
            (False, False),
            (True, True),
            (False, False),
        ]
        for head in named:
            if head.lane in share:
                assert head == share[head.lane]._replace(due_in=head.due_in)
                assert abs(head.due_in - share[head.lane].due_in) < 5
            else:
                assert not head.has_head
    finally:
        await prober.close()


async def connection_autocommit(store: StoreSettings) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True)


async def test_backoff_stays_bounded_after_many_attempts(
    pg_dsn: str, memory: MemoryTransport
) -> None:
    store = make_store(
        pg_dsn,
        lanes=1,
        max_attempts=1_000_000,
        retry_backoff="7d",
        retry_backoff_max="7d",
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    [key] = keys_in_lane(store, 0, 1)
    write(store, [key])
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute("UPDATE orders_outbox SET attempts = 999")
    memory.fail_key(key)
    result = await send(LaneRelay(store, Routing(store, {"memory": memory}), MEMBER), 0)
    assert result.scan is Scan.SENT and result.failed == 1  # recorded, not rolled back
    attempts, _, waits_for_operator = parked(store)[key]
    assert attempts == 1000 and not waits_for_operator


async def test_one_batch_sends_several_lanes_in_one_transaction(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    keys = {lane: keys_in_lane(relay_store, lane, 3, prefix=f"g{lane}") for lane in range(3)}
    for lane_keys in keys.values():
        write(relay_store, lane_keys, per_key=4)
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    results = await send_group(relay, [0, 1, 2, 3])
    assert [(r.lane, r.scan, r.sent) for r in results] == [
        (0, Scan.SENT, 12),
        (1, Scan.SENT, 12),
        (2, Scan.SENT, 12),
        (3, Scan.EMPTY, 0),
    ]
    # Read to the end and settled: each lane waits for a notification or the poll.
    assert all(r.next_in == relay.poll for r in results)
    received = memory.received("events")
    assert first_deliveries_in_order(received)
    assert bodies_by_key(received) == {
        key: [0, 1, 2, 3] for lane_keys in keys.values() for key in lane_keys
    }
    assert pending(relay_store) == 0
    with psycopg.connect(relay_store.require_dsn()) as conn:
        acquired = conn.execute(
            "SELECT count(DISTINCT token) FROM orders_leases WHERE lane IN (0, 1, 2, 3)"
        ).fetchone()
    assert acquired == (1,)  # one transaction took the three lanes it sent (lane 3 rolled in)


async def test_a_group_skips_a_lane_locked_elsewhere_and_sends_the_others(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    for lane in range(3):
        write(relay_store, keys_in_lane(relay_store, lane, 2, prefix=f"s{lane}"))
    other = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), "member-b")
    holder = await connection(relay_store)
    tokens, _ = await other.db.lock_and_read(holder, [1], "member-b", uuid.uuid4(), 10)
    assert list(tokens) == [1]
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    results = await asyncio.wait_for(send_group(relay, [0, 1, 2]), 2)
    assert [(r.lane, r.scan, r.sent) for r in results] == [
        (0, Scan.SENT, 2),
        (1, Scan.BUSY, 0),
        (2, Scan.SENT, 2),
    ]
    await holder.rollback()
    await holder.close()
    assert pending(relay_store) == 2


async def test_a_poison_key_in_a_group_parks_only_itself(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    bad, good = keys_in_lane(relay_store, 1, 2, prefix="p")
    other = keys_in_lane(relay_store, 2, 2, prefix="q")
    write(relay_store, [bad, good, *other], per_key=3)
    memory.fail_key(bad, message="broker said no")
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    results = await send_group(relay, [1, 2])
    assert [(r.lane, r.sent, r.failed) for r in results] == [(1, 3, 1), (2, 6, 0)]
    # Settled: the parked key's later rows wait for its retry, not for another scan.
    assert results[0].next_in == relay.poll
    assert parked(relay_store) == {bad: (1, "broker said no", False)}
    assert pending(relay_store) == 3


async def test_a_lost_lease_in_a_group_rolls_back_every_lane(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    write(relay_store, keys_in_lane(relay_store, 0, 2, prefix="f"))
    write(relay_store, keys_in_lane(relay_store, 3, 2, prefix="h"))
    db = RelayStore(relay_store)
    async with await connection(relay_store) as conn:
        tokens, rows = await db.lock_and_read(conn, [0, 3], MEMBER, uuid.uuid4(), 10)
        assert sorted(tokens) == [0, 3] and len(rows) == 4
        stale = {0: tokens[0], 3: str(uuid.uuid4())}
        with pytest.raises(
            FencedWriteError, match=r"lane 0, 3: the fenced (delete|progress) matched 2 of 4"
        ):
            await db.record_outcomes(
                conn,
                member=MEMBER,
                tokens=stale,
                acked=rows.batch.ids,
                acked_lanes=rows.lanes,
                failures=[],
            )
        await conn.rollback()
    assert pending(relay_store) == 4  # the lane whose lease held lost nothing either


@pytest.fixture
async def down() -> AsyncIterator[MemoryTransport]:
    """A second transport, ``down``, whose broker cannot be reached."""
    transport = MemoryTransport("down")
    await transport.start()
    transport.disconnect("broker restarting")
    yield transport
    await transport.close()


def with_down(store: StoreSettings) -> StoreSettings:
    """``store`` with the ``down`` transport configured, for writing rows that name it."""
    transports = {**store.transports, "down": {"type": "memory"}}
    return store.model_copy(update={"transports": transports})


async def test_a_lane_whose_broker_is_down_waits_while_its_group_goes_through(
    relay_store: StoreSettings, memory: MemoryTransport, down: MemoryTransport
) -> None:
    write(with_down(relay_store), keys_in_lane(relay_store, 1, 2, prefix="d"), transport="down")
    write(relay_store, keys_in_lane(relay_store, 2, 2, prefix="u"))
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory, "down": down}), MEMBER)
    results = await send_group(relay, [1, 2])
    assert [(r.lane, r.scan, r.sent) for r in results] == [
        (1, Scan.UNAVAILABLE, 0),
        (2, Scan.SENT, 2),
    ]
    assert results[0].next_in == relay.backoff and "broker restarting" in results[0].detail
    assert parked(relay_store) == {}  # not the rows' fault: no attempt counted
    assert pending(relay_store) == 2


async def test_scans_that_find_nothing_keep_the_connection_prepared_statements(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    [key] = keys_in_lane(relay_store, 0, 1)
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    async with await connection(relay_store) as conn:
        for _ in range(6):  # psycopg prepares a statement on its fifth use
            write(relay_store, [key])
            assert (await relay.send_lanes(conn, [0]))[0].sent == 1

        async def prepared() -> int:
            cursor = await conn.execute("SELECT count(*) FROM pg_prepared_statements")
            row = await cursor.fetchone()
            await conn.commit()
            assert row is not None
            return int(row[0])

        before = await prepared()
        assert before >= 2
        assert (await relay.send_lanes(conn, [0]))[0].scan is Scan.EMPTY
        assert (await relay.send_lanes(conn, [0]))[0].scan is Scan.EMPTY
        assert await prepared() == before


async def test_within_a_lane_a_down_transport_stops_only_its_own_rows(
    relay_store: StoreSettings, memory: MemoryTransport, down: MemoryTransport
) -> None:
    stuck, free = keys_in_lane(relay_store, 3, 2, prefix="m")
    write(with_down(relay_store), [stuck], per_key=2, transport="down")
    write(relay_store, [free], per_key=2)
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory, "down": down}), MEMBER)
    result = await send(relay, 3)
    assert (result.scan, result.sent, result.next_in) == (Scan.SENT, 2, 0.0)
    assert "broker restarting" in result.detail
    assert bodies_by_key(memory.received("events")) == {free: [0, 1]}
    assert parked(relay_store) == {}
    # Only the down transport's rows are left: the lane now waits for the broker.
    again = await send(relay, 3)
    assert (again.scan, again.next_in) == (Scan.UNAVAILABLE, relay.backoff)
    assert pending(relay_store) == 2


async def test_a_lost_lease_fails_the_fence_even_when_its_lane_has_nothing_to_delete(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    write(relay_store, keys_in_lane(relay_store, 0, 2, prefix="n"))
    db = RelayStore(relay_store)
    async with await connection(relay_store) as conn:
        tokens, rows = await db.lock_and_read(conn, [0, 3], MEMBER, uuid.uuid4(), 10)
        assert sorted(tokens) == [0, 3] and set(rows.lanes) == {0}
        stale = {0: tokens[0], 3: str(uuid.uuid4())}  # lane 3 acknowledged nothing
        with pytest.raises(FencedWriteError, match=r"matched 2 of 2 rows \(lease held: no\)"):
            await db.record_outcomes(
                conn,
                member=MEMBER,
                tokens=stale,
                acked=rows.batch.ids,
                acked_lanes=rows.lanes,
                failures=[],
            )
        await conn.rollback()
    assert pending(relay_store) == 2


async def test_a_lease_with_more_than_half_left_is_kept_and_an_older_one_renewed(
    relay_store: StoreSettings,
) -> None:
    db = RelayStore(relay_store)
    table = f"{relay_store.table_prefix}leases"

    def lease() -> tuple[Any, ...]:
        with psycopg.connect(relay_store.require_dsn()) as conn:
            row = conn.execute(f"SELECT token, expires_at FROM {table} WHERE lane = 2").fetchone()
        assert row is not None
        return tuple(row)

    def set_expiry(interval: str) -> None:
        with psycopg.connect(relay_store.require_dsn(), autocommit=True) as conn:
            conn.execute(
                f"UPDATE {table} SET expires_at = now() + %s::interval WHERE lane = 2", (interval,)
            )

    async def lock() -> Any:
        async with await connection(relay_store) as conn:
            tokens, _ = await db.lock_and_read(conn, [2], MEMBER, uuid.uuid4(), 10)
            await conn.commit()
        return tokens[2]

    taken = await lock()
    assert str(lease()[0]) == taken  # the token as UUID text, as the fence takes it
    expires = lease()[1]
    assert await lock() == taken and lease()[1] == expires  # fresh: locked, not rewritten
    set_expiry("1 second")  # less than half of the 4 s lease left: renewed, same token
    assert await lock() == taken and lease()[1] > expires - timedelta(seconds=3)
    set_expiry("-1 second")  # expired: taken again under a new token
    assert await lock() != taken


async def test_each_lane_of_a_group_gets_its_own_result(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    write(relay_store, keys_in_lane(relay_store, 0, 1, prefix="t"), deliver_at=later)
    write(relay_store, keys_in_lane(relay_store, 1, 2, prefix="v"))
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    results = await send_group(relay, [0, 1, 2])
    assert [(r.lane, r.scan, r.sent) for r in results] == [
        (0, Scan.FUTURE, 0),
        (1, Scan.SENT, 2),
        (2, Scan.EMPTY, 0),
    ]
    assert pending(relay_store) == 1


async def test_a_broker_lost_before_acknowledging_makes_only_its_lane_wait(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    flaky = MemoryTransport("down")
    await flaky.start()
    flaky.stall()  # publishes are taken, acknowledgements held back
    write(with_down(relay_store), keys_in_lane(relay_store, 1, 2, prefix="a"), transport="down")
    write(relay_store, keys_in_lane(relay_store, 2, 2, prefix="b"))
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory, "down": flaky}), MEMBER)
    batch = asyncio.ensure_future(send_group(relay, [1, 2]))
    await asyncio.sleep(0.2)
    flaky.disconnect("connection lost")  # the held acknowledgements fail
    results = await batch
    assert [(r.lane, r.scan, r.sent) for r in results] == [
        (1, Scan.UNAVAILABLE, 0),
        (2, Scan.SENT, 2),
    ]
    assert "connection lost" in results[0].detail and results[1].detail == ""
    assert parked(relay_store) == {}
    assert pending(relay_store) == 2
    await flaky.close()


async def test_a_key_whose_rows_name_its_transport_differently_keeps_its_order(
    relay_store: StoreSettings, memory: MemoryTransport
) -> None:
    """A row with no transport (the store's default, as SQL written elsewhere leaves it) and
    later rows of its key naming that transport: the later rows wait for the first one, and
    the one that rides behind the second may not go ahead of it (I2)."""
    [key] = keys_in_lane(relay_store, 1, 1)
    first = write(relay_store, [key])
    with psycopg.connect(relay_store.require_dsn()) as conn:  # NULL: the store's default
        conn.execute(
            psycopg.sql.SQL("UPDATE {} SET transport = NULL WHERE id = %s").format(
                psycopg.sql.Identifier(relay_store.db_schema, relay_store.names.table("outbox"))
            ),
            (first[0],),
        )
    later = write(relay_store, [key], per_key=3, transport="memory")
    relay = LaneRelay(relay_store, Routing(relay_store, {"memory": memory}), MEMBER)
    result = await send(relay, 1)
    assert result.sent == 4
    received = memory.received_all()
    assert [message.id for message in received] == [*first, *later]
    assert first_deliveries_in_order(received)
