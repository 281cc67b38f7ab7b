"""Partitioned storage (storage = "partitioned", docs/storage.md) on real PostgreSQL: the store
is created partitioned, a store of the other mode is refused, and rotation creates partitions
ahead, drops only the partitions every lane has passed (nothing lost or reordered) and
finishes a detach left half done. Lane batches in both modes: tests/integration/relay."""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from itertools import pairwise
from typing import Any
from uuid import UUID

import psycopg
import pytest

from relayer import Outbox, OutboxMessage, lane_for
from relayer.errors import ConfigurationError, InvalidMessageError
from relayer.operations import schema
from relayer.relay.batch import LaneRelay
from relayer.relay.results import Scan
from relayer.settings import StoreSettings
from relayer.store import RelayStore, drift, rotate, status
from relayer.store.backlog import read_backlog
from relayer.store.maintenance import read_table_health
from relayer.store.partitions import DROPPING, PARTITIONS_AHEAD, list_partitions, ms_of
from relayer.transports.memory import MemoryTransport
from relayer.transports.routing import Routing
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import (
    BATCH_STORE,
    bodies_by_key,
    first_deliveries_in_order,
    keys_in_lane,
    pending,
    write,
)
from tests.integration.unordered.helpers import run_worker_until

MEMBER = "member-a"
NOW = timedelta(0)  # rotate's settle: partitions wholly in the past may go


@pytest.fixture
async def memory() -> AsyncIterator[MemoryTransport]:
    transport = MemoryTransport("memory")
    await transport.start()
    yield transport
    await transport.close()


async def partitioned_store(dsn: str, **overrides: Any) -> StoreSettings:
    values: dict[str, Any] = {
        **BATCH_STORE,
        "storage": "partitioned",
        "partition_span": "1m",
        "transports": {"memory": {"type": "memory"}},
        "default_transport": "memory",
    }
    values.update(overrides)
    store = make_store(dsn, **values)
    await apply_schema(store)
    return store


async def partitions(store: StoreSettings) -> list[Any]:
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        return await list_partitions(conn, store)


def database_ms(store: StoreSettings) -> int:
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute("SELECT (extract(epoch FROM now()) * 1000)::int8").fetchone()
    assert row is not None
    return int(row[0])


def uuid7_at(ms: int) -> UUID:
    """A UUIDv7 of Unix millisecond ``ms`` (a row written by a clock that far back)."""
    return UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62) | secrets.randbits(62))


def write_old(store: StoreSettings, keys: list[str], per_key: int, minutes_ago: int) -> None:
    """Rows numbered 0..per_key-1 per key, interleaved, with ids ``minutes_ago`` minutes old
    (in the partition below every partition the store made ahead), in id order."""
    start = database_ms(store) - minutes_ago * 60_000
    with psycopg.connect(store.require_dsn()) as conn:
        for step, (number, key) in enumerate((n, k) for n in range(per_key) for k in keys):
            conn.execute(
                f"INSERT INTO {store.table_prefix}outbox (id, lane, ordering_key, transport, "
                "destination, body) VALUES (%s, %s, %s, %s, 'events', %s)",
                (
                    uuid7_at(start + step),
                    lane_for(key, store.lanes),
                    key,
                    store.default_transport,  # as relayer's writer stores it
                    f"{key}#{number}".encode(),
                ),
            )


async def send(relay: LaneRelay, lane: int) -> Any:
    async with await psycopg.AsyncConnection.connect(relay.store.require_dsn()) as conn:
        return (await relay.send_lanes(conn, [lane]))[0]


async def test_a_partitioned_store_is_made_with_partitions_ahead(pg_dsn: str) -> None:
    store = await partitioned_store(pg_dsn)
    made = await partitions(store)
    span = 60_000
    assert made[0].lower is None  # the floor: ids of a clock behind the database's
    assert ms_of(made[-1].upper) >= database_ms(store) + PARTITIONS_AHEAD * span
    assert all(a.upper == b.lower for a, b in pairwise(made))
    await apply_schema(store)  # again: nothing to do
    assert await partitions(store) == made
    rotation = await rotate(store)
    assert rotation.dropped == () and rotation.finalized == () and rotation.skipped is None
    assert [p.name for p in await partitions(store)][: len(made)] == [p.name for p in made]


async def test_rotation_drops_only_what_every_lane_passed_and_loses_nothing(
    pg_dsn: str, memory: MemoryTransport
) -> None:
    store = await partitioned_store(pg_dsn)
    floor = (await partitions(store))[0]
    keys = keys_in_lane(store, 1, 3)
    write_old(store, keys, per_key=30, minutes_ago=30)  # 90 rows in the floor partition
    relay = LaneRelay(store, Routing(store, {"memory": memory}), MEMBER)
    first = await send(relay, 1)
    assert (first.scan, first.sent) == (Scan.SENT, 50)  # batch_size: 40 old rows left
    rotation = await rotate(store, settle=NOW)
    assert rotation.dropped == ()  # lane 1 has not passed the floor yet; idle lanes pin nothing
    assert (await partitions(store))[0] == floor
    later = write(store, keys, per_key=2)  # two more rows per key, in today's partition
    assert len(later) == 6
    while (await send(relay, 1)).scan is Scan.SENT:
        pass
    assert pending(store) == 0
    rotation = await rotate(store, settle=NOW)
    assert rotation.dropped == (floor.name,)
    assert floor.name not in [p.name for p in await partitions(store)]
    received = memory.received("events")
    by_key = bodies_by_key(received)
    # The old rows 0..29, then the two new ones, which write() numbered 0 and 1 again.
    assert by_key == {key: [*range(30), 0, 1] for key in keys}
    assert first_deliveries_in_order(received)
    assert len(received) == 96
    # Rows keep flowing after the rotation, and a second rotation finds nothing to drop.
    write(store, keys, per_key=1)
    assert (await send(relay, 1)).sent == 3
    assert (await rotate(store, settle=NOW)).dropped == ()


async def test_a_parked_key_passed_by_its_lane_is_kept_across_a_rotation(
    pg_dsn: str, memory: MemoryTransport
) -> None:
    store = await partitioned_store(pg_dsn, max_attempts=1)
    bad, good = keys_in_lane(store, 2, 2)
    write_old(store, [bad, good], per_key=5, minutes_ago=30)
    memory.fail_key(bad)
    relay = LaneRelay(store, Routing(store, {"memory": memory}), MEMBER)
    result = await send(relay, 2)
    assert result.sent == 5 and result.failed == 1
    rotation = await rotate(store, settle=NOW)
    assert len(rotation.dropped) == 1  # the floor: the parked key's rows are held
    assert pending(store) == 5
    memory.clear_key(bad)
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        await conn.execute(f"DELETE FROM {store.table_prefix}parked")  # as a redrive does
        await conn.commit()
    assert (await send(relay, 2)).sent == 5
    assert bodies_by_key(memory.received("events"))[bad] == list(range(5))
    assert pending(store) == 0


async def test_a_detach_left_half_done_is_finished_by_the_next_rotation(pg_dsn: str) -> None:
    store = await partitioned_store(pg_dsn)
    floor = (await partitions(store))[0]
    # A transaction that has read the outbox keeps DETACH CONCURRENTLY waiting past its
    # lock_timeout: the partition is left marked as detaching, as by a rotation that died.
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as holder:
        await holder.execute(f"SELECT count(*) FROM {store.table_prefix}outbox")
        rotation = await rotate(store, settle=NOW)
        assert rotation.skipped is not None and "lock timeout" in rotation.skipped
        assert (await partitions(store))[0].detach_pending
        again = await rotate(store, settle=NOW)  # still held: tried, given up again
        assert again.skipped is not None and again.finalized == ()
        await holder.rollback()
    rotation = await rotate(store, settle=NOW)
    assert rotation.finalized == (floor.name,) and rotation.skipped is None
    assert floor.name not in [p.name for p in await partitions(store)]
    write(store, ["k"], per_key=1)  # writers are served throughout
    assert pending(store) == 1
    # Marked and detached, not dropped (a rotation that died in between): the next rotation
    # drops it. A partition detached by someone else is left alone.
    first, second = (await partitions(store))[2:4]
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute(f"COMMENT ON TABLE {first.name} IS '{DROPPING}'")
        for partition in (first, second):
            conn.execute(
                f"ALTER TABLE {store.table_prefix}outbox DETACH PARTITION {partition.name}"
            )
    assert (await rotate(store, settle=NOW)).finalized == (first.name,)
    with psycopg.connect(store.require_dsn()) as conn:
        found = conn.execute(
            "SELECT relname FROM pg_catalog.pg_class WHERE relname IN (%s, %s)",
            (first.name, second.name),
        ).fetchall()
    assert found == [(second.name,)]


async def test_a_store_of_the_other_mode_is_refused(pg_dsn: str) -> None:
    delete = make_store(pg_dsn)
    await apply_schema(delete)
    partitioned = make_store(pg_dsn, storage="partitioned")
    with pytest.raises(ConfigurationError, match=r"stores\.orders\.storage: 'partitioned'.*"):
        await apply_schema(partitioned)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        with pytest.raises(ConfigurationError, match=r"docs/storage\.md#moving"):
            await RelayStore(partitioned).prepare(conn)
    other = make_store(pg_dsn, table_prefix="other_", storage="partitioned")
    await apply_schema(other)
    with pytest.raises(ConfigurationError, match=r"was created for storage = 'partitioned'"):
        await apply_schema(make_store(pg_dsn, table_prefix="other_"))


async def test_unordered_messages_are_refused_in_partitioned_mode(pg_dsn: str) -> None:
    store = await partitioned_store(pg_dsn)
    with pytest.raises(InvalidMessageError, match=r"key: None is invalid: must be set"):
        write(store, [None], per_key=1)  # type: ignore[list-item]
    with psycopg.connect(store.require_dsn()) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            f"INSERT INTO {store.table_prefix}outbox (id, lane, destination, body) "
            "VALUES (%s, -1, 'events', 'x')",
            (uuid7_at(database_ms(store)),),
        )


async def test_schema_check_status_and_metrics_count_from_progress(
    pg_dsn: str, memory: MemoryTransport
) -> None:
    store = await partitioned_store(pg_dsn)
    keys = keys_in_lane(store, 1, 2)
    write(store, keys, per_key=30)  # 60 rows: a batch of 50 leaves 10
    relay = LaneRelay(store, Routing(store, {"memory": memory}), MEMBER)
    assert (await send(relay, 1)).sent == 50
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        assert await drift.check(conn, store) == []
        await RelayStore(store).prepare(conn)  # what a worker checks before serving it
        cluster = await status.read_cluster(conn, store)
        summary = await status.read_summary(conn, store)
        backlog = await read_backlog(conn, store, frozenset(range(store.lanes)), top=3)
    assert [(lane.lane, lane.rows) for lane in cluster.pending] == [(1, 10)]
    assert summary.pending == 10
    assert (backlog.rows, backlog.pending_lanes) == (10, 1)
    assert [(lane.lane, lane.rows) for lane in backlog.top] == [(1, 10)]


def test_schema_print_refuses_a_partitioned_store() -> None:
    store = make_store("postgresql://localhost/x", storage="partitioned")
    with pytest.raises(ConfigurationError, match=r"relayer schema apply"):
        schema.render(store)


async def test_a_worker_sends_and_its_cleanup_leader_rotates(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="relayer.relay.runtime")
    store = await partitioned_store(pg_dsn, cleanup_interval="0.1s", poll_interval="0.1s")
    floor = (await partitions(store))[0]
    keys = keys_in_lane(store, 0, 2)
    write(store, keys, per_key=5)
    # A half-done detach, as a rotation that died leaves it: the leader's next rotation
    # finishes it (whatever the progress: the partition was already on its way out).
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as holder:
        await holder.execute(f"SELECT count(*) FROM {store.table_prefix}outbox")
        assert (await rotate(store, settle=NOW)).skipped is not None
        await holder.rollback()

    def done() -> bool:
        with psycopg.connect(store.require_dsn()) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_catalog.pg_class WHERE relname = %s", (floor.name,)
            ).fetchone()
        return pending(store) == 0 and row == (0,)

    await run_worker_until(store, done)
    # Until the mode is ready, every worker that serves such a store says so.
    assert "storage = 'partitioned' is not ready for production" in caplog.text


@pytest.mark.parametrize("storage", ["delete", "partitioned"])
async def test_a_row_that_commits_after_its_lane_passed_its_id_is_sent(
    pg_dsn: str, memory: MemoryTransport, storage: str
) -> None:
    store = await partitioned_store(pg_dsn, storage=storage)
    early, late = keys_in_lane(store, 1, 2)
    relay = LaneRelay(store, Routing(store, {"memory": memory}), MEMBER)
    with psycopg.connect(store.require_dsn()) as slow:
        # The slow writer takes its id first and commits last, after two batches of the lane
        # (two advances of its progress) have passed its id.
        Outbox(store).write_many(slow, [OutboxMessage("events", b"slow#0", key=early)])
        write(store, [late], per_key=1)
        assert (await send(relay, 1)).sent == 1
        write(store, [late], per_key=1)
        assert (await send(relay, 1)).sent == 1
        assert (await send(relay, 1)).scan is not Scan.SENT  # nothing committed is pending
        slow.commit()
    # The idle lane's probe sees the late row (what wakes a worker's scan of it).
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        [head] = await RelayStore(store).probe(conn, [1])
    assert head.has_head
    assert pending(store) == 1
    assert (await send(relay, 1)).sent == 1
    assert (await send(relay, 1)).scan is not Scan.SENT
    assert pending(store) == 0
    assert sorted(message.body for message in memory.received("events")) == sorted(
        [f"{late}#0".encode(), f"{late}#0".encode(), b"slow#0"]
    )


async def test_a_late_row_of_a_rotated_partition_is_kept_and_sent(
    pg_dsn: str, memory: MemoryTransport
) -> None:
    store = await partitioned_store(pg_dsn)
    floor = (await partitions(store))[0]
    [key] = keys_in_lane(store, 1, 1)
    relay = LaneRelay(store, Routing(store, {"memory": memory}), MEMBER)
    with psycopg.connect(store.require_dsn()) as slow:
        # An open transaction's row in the floor partition (its id half an hour old).
        slow.execute(
            f"INSERT INTO {store.table_prefix}outbox (id, lane, ordering_key, transport, "
            "destination, body) VALUES (%s, 1, %s, 'memory', 'events', 'slow#0')",
            (uuid7_at(database_ms(store) - 1_800_000), key),
        )
        write(store, [key], per_key=1)
        assert (await send(relay, 1)).sent == 1  # the lane's progress passes the floor
        # Rotation finds the floor passed; its detach waits for the open transaction past
        # lock_timeout and is left half done.
        assert (await rotate(store, settle=NOW)).skipped is not None
        assert (await partitions(store))[0].detach_pending
        slow.commit()
    rotation = await rotate(store, settle=NOW)
    assert rotation.finalized == (floor.name,)
    assert pending(store) == 1  # copied into the held table before the partition went
    assert (await send(relay, 1)).sent == 1
    assert pending(store) == 0
    assert sorted(message.body for message in memory.received("events")) == [
        f"{key}#0".encode(),
        b"slow#0",
    ]


async def test_the_health_ages_pending_rows_not_sent_ones(
    pg_dsn: str, memory: MemoryTransport
) -> None:
    store = await partitioned_store(pg_dsn)
    [key] = keys_in_lane(store, 1, 1)
    with psycopg.connect(store.require_dsn()) as conn:  # sent rows written half an hour ago
        conn.execute(
            f"INSERT INTO {store.table_prefix}outbox (id, lane, ordering_key, transport, "
            "destination, body, created_at) VALUES (%s, 1, %s, 'memory', 'events', 'old#0', "
            "now() - interval '30 minutes')",
            (uuid7_at(database_ms(store) - 1_800_000), key),
        )
    relay = LaneRelay(store, Routing(store, {"memory": memory}), MEMBER)
    assert (await send(relay, 1)).sent == 1
    write(store, [key], per_key=1)
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        health = await read_table_health(conn, store)
    assert 0 <= health.oldest_due_age_seconds < 600  # the pending row's age, not the sent one's
