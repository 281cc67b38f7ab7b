"""The heat map's encoding: one byte per lane, computed from a snapshot's lane heads.

A lane's byte is ``state << 5 | age bucket``. The states tell apart what an operator acts on
differently; the bucket is the head's age on a log scale (``2 * log2(1 + seconds)``, capped at
31, about 13 hours), so the browser can colour and describe a lane without asking the server.
Two more arrays of one byte per lane carry the owner (an index into the snapshot's owner list)
and the pending rows (exact to 128, then 8 steps per doubling), refined in the background.
The browser decodes all three the same way (static/heatmap.js).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

EMPTY = 0  # no rows
FLOWING = 1  # rows, leased, the head moves
WAITING = 2  # the head is future-dated (deliver_at): nothing is due yet
UNOWNED = 3  # rows and no live lease: no worker sends this lane
STALLED = 4  # leased, due, not parked, and the head has not moved for a lease or longer
RETRYING = 5  # a key of the lane is parked and will be retried
PARKED = 6  # a key of the lane waits for an operator (redrive or drop)
STATE_NAMES = {
    EMPTY: "empty",
    FLOWING: "flowing",
    WAITING: "waiting",
    UNOWNED: "unowned",
    STALLED: "stalled",
    RETRYING: "retrying",
    PARKED: "parked",
}
MAX_BUCKET = 31
OTHER_OWNER = 255  # more than 254 distinct owners: the rest share this index
EXACT_PENDING = 128


def pending_byte(rows: int) -> int:
    if rows <= EXACT_PENDING:
        return max(rows, 0)
    return min(255, EXACT_PENDING + math.ceil(8 * math.log2(rows / EXACT_PENDING)))


@dataclass(frozen=True, slots=True)
class LaneSummary:
    lane: int
    state: int
    age_seconds: float
    owner: str | None

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]


@dataclass(frozen=True, slots=True)
class LaneMap:
    states: bytes  # state << 5 | age bucket, one byte per lane
    owner_bytes: bytes  # 0: no live lease; n: owners[n - 1]
    owners: tuple[str, ...]
    counts: dict[str, int]  # lanes per state name
    oldest: tuple[LaneSummary, ...]  # the lanes with the oldest heads, oldest first
    oldest_age_seconds: float


def lane_map(lanes: int, row: Sequence[Any], stalled: Iterable[int]) -> LaneMap:
    """The heat map from the ``dash_lane_map`` row, with the ``stalled`` lanes (flowing lanes
    whose head the sampler saw unchanged for a lease or longer) marked."""
    _now, busy, values, counted, owners, owner_lanes, top = row[:7]
    states = bytearray(lanes)
    for lane, value in zip(busy, values, strict=True):
        if 0 <= lane < lanes:
            states[lane] = value
    counts = dict.fromkeys(STATE_NAMES.values(), 0)
    for state, count in counted:
        counts[STATE_NAMES[int(state)]] = int(count)
    for lane in stalled:
        if states[lane] >> 5 == FLOWING:
            states[lane] = STALLED << 5 | (states[lane] & MAX_BUCKET)
            counts["flowing"] -= 1
            counts["stalled"] += 1
    counts["empty"] = lanes - sum(counts.values())
    names = tuple(str(name) for name in owners)
    owner_of = bytearray(lanes)
    for index, text in enumerate(owner_lanes):
        value = min(index + 1, OTHER_OWNER)
        for lane in map(int, str(text).split(",")):
            if 0 <= lane < lanes:
                owner_of[lane] = value

    def owner(lane: int) -> str | None:
        index = owner_of[lane]
        if not index:
            return None
        return names[index - 1] if index < OTHER_OWNER else "one of many"

    oldest = tuple(
        LaneSummary(int(lane), states[int(lane)] >> 5, float(age), owner(int(lane)))
        for lane, age in top
    )
    return LaneMap(
        bytes(states),
        bytes(owner_of),
        names,
        counts,
        oldest,
        oldest[0].age_seconds if oldest else 0.0,
    )


def pending_map(lanes: int, counts: Mapping[int, int]) -> bytes:
    """One byte per lane for the refined pending counts."""
    values = bytearray(lanes)
    for lane, rows in counts.items():
        if 0 <= lane < lanes:
            values[lane] = pending_byte(rows)
    return bytes(values)
