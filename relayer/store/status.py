"""The statements of ``relayer status``: a store's live members, live lane leases and pending
rows per lane, and the one-statement line of ``relayer status --all``.

Statements live in ``relayer/sql/operations.sql``. Driver errors become StoreError in the
driver's own words (:func:`relayer.store.driver.translated_verbatim`): ``status --all`` shows
them as the store's line, the way an operator has always read them there.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from relayer.lanes import UNORDERED_LANE
from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.store.driver import Connection, translated_verbatim
from relayer.store.schema import require_schema


@dataclass(frozen=True, slots=True)
class Member:
    instance: str
    expires_at: datetime
    age_seconds: float


@dataclass(frozen=True, slots=True)
class LanePending:
    lane: int | None  # None: unordered rows
    rows: int
    oldest_age_seconds: float


@dataclass(frozen=True, slots=True)
class Cluster:
    """What a store's cluster looks like now: the live members, in the heartbeat's ranking
    (ORDER BY owner, in the database's collation); each live lane lease as (lane, owner), by
    lane; and the pending rows per lane (unordered rows last)."""

    members: tuple[Member, ...]
    leases: tuple[tuple[int, str], ...]
    pending: tuple[LanePending, ...]


async def read_cluster(conn: Connection, store: StoreSettings) -> Cluster:
    """``store``'s members, lane leases and pending rows (the schema checked already)."""
    queries = queries_for(store.names, store.storage)
    with translated_verbatim():
        cursor = await conn.execute(queries["status_members"])
        members = tuple(Member(row[0], row[1], float(row[2])) for row in await cursor.fetchall())
        cursor = await conn.execute(queries["status_lane_owners"])
        leases = tuple((int(row[0]), str(row[1])) for row in await cursor.fetchall())
        cursor = await conn.execute(queries["status_pending"])
        pending = tuple(
            LanePending(
                None if row[0] == UNORDERED_LANE else int(row[0]), int(row[1]), float(row[2])
            )
            for row in await cursor.fetchall()
        )
    return Cluster(members, leases, pending)


@dataclass(frozen=True, slots=True)
class StoreSummary:
    """One line of ``relayer status --all``: a store's backlog, parked keys and members, or
    why it could not be read (``error``)."""

    store: str
    pending: int = 0
    oldest_age_seconds: float = 0.0
    parked: int = 0
    waiting_for_operator: int = 0
    members: int = 0
    error: str = ""

    @property
    def rank(self) -> tuple[int, int, float, int, str]:
        """Worst first: unreadable, then keys waiting for an operator, then the oldest row,
        the longest backlog; by name last."""
        return (
            0 if self.error else 1,
            -self.waiting_for_operator,
            -self.oldest_age_seconds,
            -self.pending,
            self.store,
        )


async def read_summary(conn: Connection, store: StoreSettings) -> StoreSummary:
    """``store``'s line of ``status --all`` in one statement, after the schema check
    (SchemaNotAppliedError, saying what to run, before `schema apply`)."""
    with translated_verbatim():
        await require_schema(conn, store)
        cursor = await conn.execute(queries_for(store.names, store.storage)["status_summary"])
        row = await cursor.fetchone()
    assert row is not None  # aggregates only: always one row
    pending, oldest, parked, waiting, members = row
    return StoreSummary(
        store.name, int(pending), float(oldest or 0.0), int(parked), int(waiting), int(members)
    )
