"""How the scans due together are spread over batches (Grouping._spread): one batch under
a light load, a batch per SPREAD_LANES of them when more lanes wait than SPREAD_BATCH_LANES, and
never more than the connection budget serves without waiting."""

from __future__ import annotations

from relayer.relay.batch import SPREAD_BATCH_LANES
from relayer.relay.grouping import SPREAD_LANES
from relayer.relay.runtime import StoreRelay
from relayer.settings import WorkerSettings, store_settings
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker


def relay(**settings: int) -> StoreRelay:
    store = store_settings(
        name="orders",
        dsn="postgresql://nowhere/db",
        lanes=4096,
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    worker = Worker(
        [store],
        transports={"orders": {"memory": MemoryTransport("memory")}},
        settings=WorkerSettings(**settings),
    )
    return worker.stores["orders"].relay


def waiting(store: StoreRelay, count: int) -> None:
    for lane in range(1000, 1000 + count):
        store.schedule.queue.schedule(lane, 0.0)


def test_scans_due_together_share_a_batch_unless_more_lanes_wait_than_it_takes() -> None:
    store = relay(pool_size=20)
    lanes = list(range(16))
    assert store.grouping._spread(lanes) == [lanes]  # nothing waits
    waiting(store, SPREAD_BATCH_LANES - len(lanes))
    assert store.grouping._spread(lanes) == [lanes]  # one batch is counted for them all
    waiting(store, SPREAD_BATCH_LANES)
    assert store.grouping._spread(lanes) == [
        lanes[0::2],
        lanes[1::2],
    ]  # as many as the waiting need
    waiting(store, 10 * SPREAD_BATCH_LANES)
    spread = store.grouping._spread(lanes)
    assert len(spread) == len(lanes) // SPREAD_LANES
    assert sorted(lane for batch in spread for lane in batch) == lanes
    assert store.grouping._spread(lanes[:SPREAD_LANES]) == [lanes[:SPREAD_LANES]]


async def test_no_more_batches_than_connections_to_be_had_without_waiting() -> None:
    store = relay(pool_size=20, max_connections=5)
    for _ in range(3):  # the database's fixed connections: 2 units left for batches
        await store.pool.pool.budget.reserve()
    waiting(store, 10 * SPREAD_BATCH_LANES)
    lanes = list(range(16))
    assert len(store.grouping._spread(lanes)) == 2
    store.grouping._connecting = 1  # a batch of the store is being connected
    assert store.grouping._spread(lanes) == [lanes]
