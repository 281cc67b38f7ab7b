"""``relayer status``: what a store's cluster is doing, read in one go."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from relayer.connection import connect
from relayer.errors import ConfigurationError, RelayerError
from relayer.lanes import UNORDERED_LANE
from relayer.operations.health import StoreHealth, read_health
from relayer.operations.parked import ParkedKey, read_parked
from relayer.operations.schema import require_schema
from relayer.redact import redact
from relayer.relay.membership import share
from relayer.settings import StoreSettings
from relayer.sql import queries_for

if TYPE_CHECKING:
    from relayer.fleet.templates import TemplateSettings

# Databases ``status --all`` reads at once.
SUMMARY_CONNECTIONS = 4
# How long ``status --all`` waits for one database's stores before reporting it unreachable.
SUMMARY_TIMEOUT = 10.0


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


async def read_summary(conn: psycopg.AsyncConnection[Any], store: StoreSettings) -> StoreSummary:
    """``store``'s line of ``status --all`` in one statement (after the schema check)."""
    await require_schema(conn, store)
    cursor = await conn.execute(queries_for(store.names)["status_summary"])
    row = await cursor.fetchone()
    assert row is not None
    pending, oldest, parked, waiting, members = row
    return StoreSummary(
        store.name, int(pending), float(oldest or 0.0), int(parked), int(waiting), int(members)
    )


async def read_summaries(
    stores: Sequence[StoreSettings], *, concurrency: int = SUMMARY_CONNECTIONS
) -> list[StoreSummary]:
    """Every store's summary, worst first: one connection per database at a time (stores
    that share a DSN are read on one connection, one after the other), at most
    ``concurrency`` databases at once. A store or database that cannot be read gets a line
    saying why instead of failing the others."""
    by_database: dict[str, list[StoreSettings]] = {}
    for store in stores:
        by_database.setdefault(store.require_dsn(), []).append(store)
    limit = asyncio.Semaphore(concurrency)
    found: list[StoreSummary] = []

    async def read(group: list[StoreSettings]) -> None:
        done: set[str] = set()
        await limit.acquire()  # the timeout starts once this database's turn comes
        try:
            async with (
                asyncio.timeout(SUMMARY_TIMEOUT),
                await connect(group[0], purpose="status") as conn,
            ):
                for store in group:
                    try:
                        summary = await read_summary(conn, store)
                    except (RelayerError, psycopg.Error) as exc:
                        if conn.broken:
                            raise
                        summary = StoreSummary(store.name, error=_first_line(exc))
                    found.append(summary)
                    done.add(store.name)
        except TimeoutError:
            error = f"no answer within {SUMMARY_TIMEOUT:g} s"
            found.extend(StoreSummary(s.name, error=error) for s in group if s.name not in done)
        except (RelayerError, psycopg.Error) as exc:
            error = _first_line(exc)
            found.extend(StoreSummary(s.name, error=error) for s in group if s.name not in done)
        finally:
            limit.release()

    await asyncio.gather(*(read(group) for group in by_database.values()))
    return sorted(found, key=lambda summary: summary.rank)


@dataclass(frozen=True, slots=True)
class TemplateListing:
    """The stores a template's source lists now, and a ``status --all`` line for the source
    if it cannot be read (``readable`` False) or for each row that breaks a rule."""

    template: str
    stores: tuple[StoreSettings, ...]
    problems: tuple[StoreSummary, ...]
    readable: bool


async def list_template(template: TemplateSettings) -> TemplateListing:
    """Read ``template``'s discovery source once and validate each row like a configured
    store; a source that cannot be read or a row that breaks a rule gets a line of its own
    (``TEMPLATE.*``, ``TEMPLATE.?``), without a secret."""
    from relayer.fleet.sources import DiscoveryError, read_source
    from relayer.fleet.templates import store_from_row

    name = template.name
    try:
        rows = await read_source(template)
    except DiscoveryError as exc:
        problem = StoreSummary(f"{name}.*", error=f"its source cannot be read: {_first_line(exc)}")
        return TemplateListing(name, (), (problem,), readable=False)
    stores: list[StoreSettings] = []
    problems: list[StoreSummary] = []
    for row in rows:
        try:
            if isinstance(row, ConfigurationError):
                raise row
            stores.append(store_from_row(template, row).settings)
        except ConfigurationError as exc:
            skipped = f"a row is skipped: {_first_line(exc)}"
            problems.append(StoreSummary(f"{name}.?", error=skipped))
    return TemplateListing(name, tuple(stores), tuple(problems), readable=True)


async def fleet_stores(
    stores: Sequence[StoreSettings], templates: Sequence[TemplateSettings]
) -> tuple[list[StoreSettings], list[StoreSummary]]:
    """The stores of ``relayer status --all`` and of the dashboard's Fleet page: ``stores``
    and every store a template's source lists now (the sources read at once); and a line for
    each source that cannot be read or row that breaks a rule (the others are still read)."""
    listings = await asyncio.gather(*(list_template(template) for template in templates))
    found = list(stores)
    problems: list[StoreSummary] = []
    for listing in listings:
        found.extend(listing.stores)
        problems.extend(listing.problems)
    return found, problems


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return redact(text.splitlines()[0]) if text else type(exc).__name__
