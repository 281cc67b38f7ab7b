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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


def age_bucket(seconds: float) -> int:
    if seconds <= 0:
        return 0
    return min(MAX_BUCKET, int(2 * math.log2(1 + seconds)))


def bucket_floor(bucket: int) -> float:
    """The lowest age (seconds) a bucket stands for."""
    return float(2 ** (bucket / 2) - 1)


def pending_byte(rows: int) -> int:
    if rows <= EXACT_PENDING:
        return max(rows, 0)
    return min(255, EXACT_PENDING + math.ceil(8 * math.log2(rows / EXACT_PENDING)))


def pending_floor(value: int) -> int:
    """The lowest row count a pending byte stands for (exact up to 128)."""
    if value <= EXACT_PENDING:
        return value
    return math.floor(EXACT_PENDING * 2 ** ((value - EXACT_PENDING - 1) / 8)) + 1


@dataclass(frozen=True, slots=True)
class Head:
    created_ms: int  # the head's UUIDv7 time
    tail: int  # the random end of its id: a different value means the head moved
    future: bool


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


def classify(
    lanes: int,
    now_ms: int,
    *,
    heads: Mapping[int, Head],
    owners: Mapping[str, Sequence[int]],
    parked: Mapping[int, bool],
    stuck_seconds: Mapping[int, float],
    stall_after_seconds: float,
    top: int = 50,
) -> LaneMap:
    """Every lane's byte. ``parked`` maps a lane to True when one of its keys waits for an
    operator (False: only retrying keys); ``stuck_seconds`` is how long each lane's head has
    been the same (the sampler tracks it across snapshots)."""
    owner_names = tuple(sorted(owners))
    owner_of = bytearray(lanes)
    owner_name: dict[int, str] = {}
    for index, name in enumerate(owner_names):
        value = min(index + 1, OTHER_OWNER)
        for lane in owners[name]:
            if 0 <= lane < lanes:
                owner_of[lane] = value
                owner_name[lane] = name
    states = bytearray(lanes)
    counts = dict.fromkeys(STATE_NAMES.values(), 0)
    counts["empty"] = lanes
    ages: list[tuple[float, int, int]] = []
    for lane in set(heads) | set(parked):
        if not 0 <= lane < lanes:
            continue
        head = heads.get(lane)
        age = max((now_ms - head.created_ms) / 1000, 0.0) if head else 0.0
        if lane in parked:
            state = PARKED if parked[lane] else RETRYING
        elif head is None:
            continue
        elif head.future:
            state = WAITING
        elif not owner_of[lane]:
            state = UNOWNED
        elif stuck_seconds.get(lane, 0.0) >= stall_after_seconds:
            state = STALLED
        else:
            state = FLOWING
        states[lane] = state << 5 | age_bucket(age)
        counts["empty"] -= 1
        counts[STATE_NAMES[state]] += 1
        if head is not None:
            ages.append((age, lane, state))
    ages.sort(key=lambda item: (-item[0], item[1]))
    oldest = tuple(
        LaneSummary(lane, state, age, owner_name.get(lane)) for age, lane, state in ages[:top]
    )
    return LaneMap(
        bytes(states),
        bytes(owner_of),
        owner_names,
        counts,
        oldest,
        ages[0][0] if ages else 0.0,
    )


def pending_map(lanes: int, counts: Mapping[int, int]) -> bytes:
    """One byte per lane for the refined pending counts."""
    values = bytearray(lanes)
    for lane, rows in counts.items():
        if 0 <= lane < lanes:
            values[lane] = pending_byte(rows)
    return bytes(values)
