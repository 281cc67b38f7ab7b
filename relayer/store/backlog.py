"""The statements of the backlog gauges (relayer.observability.metrics.backlog): totals and
the ``top`` oldest lanes of the lanes one worker owns, read every metrics interval.

Statements live in ``relayer/sql/metrics.sql``; driver errors become StoreError in the
driver's own words (the exporter logs them).
"""

from __future__ import annotations

from dataclasses import dataclass

from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.store.driver import Connection, translated_verbatim


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
    conn: Connection, store: StoreSettings, lanes: frozenset[int], top: int
) -> Backlog:
    """The backlog of ``lanes``, with ``top`` lanes in detail; unordered rows too when lane 0
    is among them (one worker reports them)."""
    queries = queries_for(store.names, store.storage)
    with translated_verbatim():
        cursor = await conn.execute(
            queries["metrics_backlog"], {"lanes": sorted(lanes), "top": top}
        )
        row = await cursor.fetchone()
        unordered = None
        if 0 in lanes:
            cursor = await conn.execute(queries["metrics_unordered_backlog"])
            unordered = await cursor.fetchone()
    assert row is not None  # an aggregate: always one row
    rows, oldest, pending_lanes, parked, waiting, top_lanes, top_rows, top_ages = row
    found = [
        LaneBacklog(int(lane), int(count), float(age))
        for lane, count, age in zip(top_lanes, top_rows, top_ages, strict=True)
    ]
    rows, oldest = int(rows), float(oldest)
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
