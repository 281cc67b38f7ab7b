"""The dashboard's views that put several reads together with what they mean: a lane's
detail with why it is not moving (paused, at its limit, a future-dated head, parked keys, no
lease, stalled: from the latest snapshot and the lane's rows), a store's queues (the queue
controls' states and audit rows, and who holds the slots) and its health (the table health
with its warnings, the index sizes, the schema drift and version).

The reads are the gateway's (relayer.store.inspection, relayer.store.maintenance,
relayer.store.schema) and the queue controls' (relayer.dispatch.control); a driver error
becomes a StoreError in the driver's own words, as on every page.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from relayer.dashboard.lanes import STALLED
from relayer.dashboard.sampler import Snapshot
from relayer.dispatch.control import QueueControl, QueueEvent, QueueStatus, queue_lock_key
from relayer.dispatch.policies import ALL_QUEUES
from relayer.operations.health import StoreHealth, with_warnings
from relayer.settings import StoreSettings
from relayer.store.driver import Connection, translated_verbatim
from relayer.store.inspection import (
    Holder,
    IndexSize,
    LaneDetail,
    index_sizes,
    read_lane,
    schema_drift,
    slot_holders,
)
from relayer.store.maintenance import read_table_health
from relayer.store.schema import read_meta

EVENTS_SHOWN = 50  # the latest queue changes on the Queues page


@dataclass(frozen=True, slots=True)
class QueuesView:
    states: tuple[QueueStatus, ...]
    events: tuple[QueueEvent, ...]
    holders: tuple[Holder, ...]
    all_paused: bool


@dataclass(frozen=True, slots=True)
class HealthView:
    health: StoreHealth
    indexes: tuple[IndexSize, ...]
    drift: tuple[str, ...]
    schema_version: int | None


async def lane_detail(
    conn: Connection, store: StoreSettings, lane: int, snapshot: Snapshot | None
) -> LaneDetail:
    """``lane``'s lease, rows and parked keys, and why it is not moving (when it is not)."""
    detail = await read_lane(conn, store, lane)
    return replace(detail, reasons=why_not_moving(detail, snapshot, store))


def why_not_moving(
    detail: LaneDetail, snapshot: Snapshot | None, store: StoreSettings
) -> tuple[str, ...]:
    """What holds a lane back: paused, at its limit, future-dated head, parked, unowned,
    stalled. Empty when its rows flow (or it has none)."""
    if not detail.rows:
        return ()
    reasons: list[str] = []
    if snapshot is not None:
        for queue in snapshot.queues:
            if queue.paused and queue.queue in (ALL_QUEUES, store.name):
                which = "every queue of the store" if queue.queue == ALL_QUEUES else "its queue"
                why = f": {queue.reason}" if queue.reason else ""
                reasons.append(f"{which} is paused by {queue.changed_by or 'someone'}{why}")
            elif (
                queue.queue == store.name
                and queue.limit is not None
                and (queue.slots_in_use or 0) >= queue.limit
            ):
                reasons.append(f"its queue is at its concurrency limit ({queue.limit})")
        state = snapshot.lane_map.states[detail.lane] >> 5 if detail.lane < snapshot.lanes else 0
        if state == STALLED:
            reasons.append(
                "stalled: leased and due, but its head has not moved for a lease or longer; "
                "check the broker and the owner's logs"
            )
    head = detail.rows[0]
    if head.future and head.deliver_at is not None:
        reasons.append(f"its head row is due at {head.deliver_at:%Y-%m-%d %H:%M:%S %Z}")
    for key in detail.parked:
        if key.waiting_for_operator:
            reasons.append(f"key {key.key!r} is parked and waits for an operator")
        elif key.retry_at is not None:
            reasons.append(f"key {key.key!r} is parked until {key.retry_at:%H:%M:%S %Z}")
    if not detail.lease_live:
        reasons.append("no worker holds its lease: check that workers run for this store")
    return tuple(reasons)


async def queues_view(conn: Connection, store: StoreSettings) -> QueuesView:
    """The store's queue states, their latest changes and who holds their slots now."""
    with translated_verbatim():
        control = QueueControl(conn, store.names)
        states = await control.status([store.name])
        events = await control.events(limit=EVENTS_SHOWN)
    queues = {queue_lock_key(store.names, state.queue): state.queue for state in states}
    holders = await slot_holders(conn, store, queues)
    every = next((state for state in states if state.queue == ALL_QUEUES), None)
    return QueuesView(states, events, holders, bool(every and every.paused))


async def health_view(conn: Connection, store: StoreSettings) -> HealthView:
    """The table health with its warnings, the index sizes, the schema drift and version."""
    with translated_verbatim():
        health = await read_table_health(conn, store)
        indexes = await index_sizes(conn, store)
        meta = await read_meta(conn, store.names)
        drift = await schema_drift(conn, store)
    version = meta.schema_version if meta else None
    return HealthView(with_warnings(health, store), indexes, drift, version)
