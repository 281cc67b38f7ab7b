"""Why a lane is not moving: its detail read through the store (relayer.store.inspection),
with the reasons the latest snapshot and the lane's rows give (paused, at its limit, a
future-dated head, parked keys, no lease, stalled)."""

from __future__ import annotations

from dataclasses import replace

from relayer.dashboard.lanes import STALLED
from relayer.dashboard.sampler import Snapshot
from relayer.dispatch.policies import ALL_QUEUES
from relayer.settings import StoreSettings
from relayer.store.driver import Connection
from relayer.store.inspection import LaneDetail, read_lane


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
