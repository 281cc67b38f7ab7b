"""The backlog gauges' data: what waits in the lanes one worker owns, read every interval.

A worker reads only the lanes its membership gives it, so summed over workers each lane counts
once. The answer is bounded whatever the lane count: per store the totals (pending rows, the
oldest head row's age, lanes with rows, parked keys) and at most ``top`` lanes, those whose
head row is oldest. A scrape therefore has the same size with 64 lanes or 65,536, empty or all
backlogged: per-lane series for every owned lane were 131,180 lines (7.6 MB) at 65,536 lanes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from relayer.sql import queries_for

if TYPE_CHECKING:
    from relayer.worker.served import ServedStore

# Per-lane series for at most this many lanes per store unless told otherwise (--metrics-top-lanes).
DEFAULT_TOP_LANES = 10
MAX_TOP_LANES = 1000


@dataclass(frozen=True, slots=True)
class LaneBacklog:
    """One lane's backlog (lane None: rows without an ordering key)."""

    lane: int | None
    rows: int
    oldest_age_seconds: float

    @property
    def label(self) -> str:
        return "unordered" if self.lane is None else str(self.lane)


@dataclass(frozen=True, slots=True)
class Backlog:
    """One store's backlog over ``lanes``, the lanes the worker owned when it was read."""

    lanes: frozenset[int]
    rows: int = 0  # unordered rows included when lane 0 is among ``lanes``
    oldest_age_seconds: float = 0.0
    pending_lanes: int = 0  # lanes with at least one row (the unordered pseudo-lane apart)
    parked_retry: int = 0  # parked keys in backoff
    parked_operator: int = 0  # parked keys waiting for `relayer parked redrive` or `drop`
    # The lanes whose head row is oldest, oldest first, then the unordered rows when there are
    # (none of them when the detail is off).
    top: tuple[LaneBacklog, ...] = ()


async def read_backlog(
    conn: psycopg.AsyncConnection[Any],
    served: ServedStore,
    lanes: frozenset[int],
    top: int = DEFAULT_TOP_LANES,
) -> Backlog:
    """The backlog of ``lanes``, with ``top`` lanes in detail; unordered rows too when lane 0
    is among them (one worker reports them)."""
    queries = queries_for(served.store.names)
    cursor = await conn.execute(queries["metrics_backlog"], {"lanes": sorted(lanes), "top": top})
    row = await cursor.fetchone()
    assert row is not None  # an aggregate: always one row
    rows, oldest, pending_lanes, parked, waiting, top_lanes, top_rows, top_ages = row
    found = [
        LaneBacklog(int(lane), int(count), float(age))
        for lane, count, age in zip(top_lanes, top_rows, top_ages, strict=True)
    ]
    rows, oldest = int(rows), float(oldest)
    if 0 in lanes:
        cursor = await conn.execute(queries["metrics_unordered_backlog"])
        unordered = await cursor.fetchone()
        if unordered is not None and int(unordered[0]):
            if top:
                found.append(LaneBacklog(None, int(unordered[0]), float(unordered[1])))
            rows += int(unordered[0])
            oldest = max(oldest, float(unordered[1]))
    return Backlog(
        lanes,
        rows,
        oldest,
        int(pending_lanes),
        int(parked) - int(waiting),
        int(waiting),
        tuple(found),
    )


def owned_now(backlog: Backlog, lanes: frozenset[int]) -> Sequence[LaneBacklog]:
    """The detail lanes the worker still owns (``lanes``, its share now): a lane handed over
    since the refresh is its new owner's to report."""
    if lanes is backlog.lanes:
        return backlog.top
    return [lane for lane in backlog.top if (0 if lane.lane is None else lane.lane) in lanes]
