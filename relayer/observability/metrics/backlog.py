"""The backlog gauges' data: what waits in the lanes one worker owns, read every interval.

A worker reads only the lanes its membership gives it, so summed over workers each lane counts
once. The answer is bounded whatever the lane count: per store the totals (pending rows, the
oldest head row's age, lanes with rows, parked keys) and at most ``top`` lanes, those whose
head row is oldest. A scrape therefore has the same size with 64 lanes or 65,536, empty or all
backlogged: per-lane series for every owned lane were 131,180 lines (7.6 MB) at 65,536 lanes.
The statements are relayer.store.backlog's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from relayer.store import backlog as statements
from relayer.store.backlog import Backlog, LaneBacklog
from relayer.store.driver import Connection

if TYPE_CHECKING:
    from relayer.worker.served import ServedStore

# Per-lane series for at most this many lanes per store unless told otherwise (--metrics-top-lanes).
DEFAULT_TOP_LANES = 10
MAX_TOP_LANES = 1000


async def read_backlog(
    conn: Connection,
    served: ServedStore,
    lanes: frozenset[int],
    top: int = DEFAULT_TOP_LANES,
) -> Backlog:
    """The backlog of ``lanes`` of ``served``'s store, with ``top`` lanes in detail;
    unordered rows too when lane 0 is among them (one worker reports them). StoreError when
    it cannot be read."""
    return await statements.read_backlog(conn, served.store, lanes, top)


def owned_now(backlog: Backlog, lanes: frozenset[int]) -> Sequence[LaneBacklog]:
    """The detail lanes the worker still owns (``lanes``, its share now): a lane handed over
    since the refresh is its new owner's to report."""
    if lanes is backlog.lanes:
        return backlog.top
    return [lane for lane in backlog.top if (0 if lane.lane is None else lane.lane) in lanes]


__all__ = [
    "DEFAULT_TOP_LANES",
    "MAX_TOP_LANES",
    "Backlog",
    "LaneBacklog",
    "owned_now",
    "read_backlog",
]
