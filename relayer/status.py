"""``relayer status``: what a store's cluster is doing, read in one go."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from relayer.health import StoreHealth, read_health
from relayer.lanes import UNORDERED_LANE
from relayer.membership import share
from relayer.parked import ParkedKey, read_parked
from relayer.schema import require_schema
from relayer.settings import StoreSettings
from relayer.sql import queries_for


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
class StoreStatus:
    store: str
    lanes: int
    members: tuple[Member, ...]
    # Who sends each lane: the holder of its live lease, else the live member whose share it is
    # (an idle member holds no lease, yet its lanes are its own).
    owners: dict[int, str]
    pending: tuple[LanePending, ...]
    parked: tuple[ParkedKey, ...]
    health: StoreHealth | None = None  # dead tuples, vacuum, sizes, warnings (docs/operations.md)
    leased: tuple[int, ...] = ()  # the lanes whose lease is live now (a batch ran recently)

    @property
    def total_pending(self) -> int:
        return sum(lane.rows for lane in self.pending)

    @property
    def oldest_age_seconds(self) -> float:
        return max((lane.oldest_age_seconds for lane in self.pending), default=0.0)


async def read_status(conn: psycopg.AsyncConnection[Any], store: StoreSettings) -> StoreStatus:
    """The store's state; SchemaNotAppliedError (saying what to run) before `schema apply`."""
    await require_schema(conn, store)
    queries = queries_for(store.names)
    cursor = await conn.execute(queries["status_members"])
    members = tuple(Member(row[0], row[1], float(row[2])) for row in await cursor.fetchall())
    cursor = await conn.execute(queries["status_lane_owners"])
    leases = {int(row[0]): str(row[1]) for row in await cursor.fetchall()}
    owners = _owners(leases, [member.instance for member in members], store.lanes)
    cursor = await conn.execute(queries["status_pending"])
    pending = tuple(
        LanePending(None if row[0] == UNORDERED_LANE else int(row[0]), int(row[1]), float(row[2]))
        for row in await cursor.fetchall()
    )
    parked = tuple(await read_parked(conn, store))
    health = await read_health(conn, store)
    return StoreStatus(
        store.name, store.lanes, members, owners, pending, parked, health, tuple(sorted(leases))
    )


def _owners(leases: dict[int, str], members: list[str], lanes: int) -> dict[int, str]:
    """Live leases, completed with each live member's share. ``members`` come ordered by the
    database, as the heartbeat ranks them (ORDER BY owner, in the database's collation)."""
    owners = dict(leases)
    for rank, member in enumerate(members):
        for lane in share(rank, len(members), lanes):
            owners.setdefault(lane, member)
    return dict(sorted(owners.items()))
