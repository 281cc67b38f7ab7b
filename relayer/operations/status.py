"""``relayer status``: what a store's cluster is doing, read in one go; ``status --all``:
one line per store, read database by database (the statements: relayer.store.status)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relayer.errors import RelayerError
from relayer.operations.health import StoreHealth, read_health
from relayer.operations.schema import require_schema
from relayer.redact import redact
from relayer.relay.membership import share
from relayer.settings import StoreSettings
from relayer.store.driver import Connection, connect, is_broken
from relayer.store.parked import ParkedKey, read_parked
from relayer.store.status import (
    LanePending,
    Member,
    StoreSummary,
    read_cluster,
    read_summary,
)

if TYPE_CHECKING:
    from relayer.fleet.templates import Tables
    from relayer.settings import TemplateSettings

# Databases ``status --all`` reads at once.
SUMMARY_CONNECTIONS = 4
# How long ``status --all`` waits for one database's stores before reporting it unreachable.
SUMMARY_TIMEOUT = 10.0


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


async def read_status(conn: Connection, store: StoreSettings) -> StoreStatus:
    """The store's state; SchemaNotAppliedError (saying what to run) before `schema apply`."""
    await require_schema(conn, store)
    cluster = await read_cluster(conn, store)
    leases = dict(cluster.leases)
    owners = _owners(leases, [member.instance for member in cluster.members], store.lanes)
    parked = tuple(await read_parked(conn, store))
    health = await read_health(conn, store)
    return StoreStatus(
        store.name,
        store.lanes,
        cluster.members,
        owners,
        cluster.pending,
        parked,
        health,
        tuple(sorted(leases)),
    )


def _owners(leases: dict[int, str], members: list[str], lanes: int) -> dict[int, str]:
    """Live leases, completed with each live member's share. ``members`` come ordered by the
    database, as the heartbeat ranks them (ORDER BY owner, in the database's collation)."""
    owners = dict(leases)
    for rank, member in enumerate(members):
        for lane in share(rank, len(members), lanes):
            owners.setdefault(lane, member)
    return dict(sorted(owners.items()))


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
                    except RelayerError as exc:
                        if is_broken(conn):
                            raise
                        summary = StoreSummary(store.name, error=_first_line(exc))
                    found.append(summary)
                    done.add(store.name)
        except TimeoutError:
            error = f"no answer within {SUMMARY_TIMEOUT:g} s"
            found.extend(StoreSummary(s.name, error=error) for s in group if s.name not in done)
        except RelayerError as exc:
            # The connection was opened as the group's first store: each store says its own
            # name (their DSN is the same).
            error = _first_line(exc).removeprefix(f"store {group[0].name!r}: ")
            found.extend(
                StoreSummary(s.name, error=f"store {s.name!r}: {error}")
                for s in group
                if s.name not in done
            )
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


async def list_template(
    template: TemplateSettings, taken: Mapping[Tables, str] | None = None
) -> TemplateListing:
    """Read ``template``'s source once and validate its rows as the worker does (each like a
    configured store, no store listed twice, no tables shared with another row or with the
    stores of ``taken``: tables -> name); a source that cannot be read or a row the worker
    skips gets a line of its own (``TEMPLATE.*``, ``TEMPLATE.?``), without a secret."""
    from relayer.fleet.sources import DiscoveryError, read_source
    from relayer.fleet.templates import validate_rows

    name = template.name
    try:
        rows = await read_source(template)
    except DiscoveryError as exc:
        problem = StoreSummary(f"{name}.*", error=f"its source cannot be read: {_first_line(exc)}")
        return TemplateListing(name, (), (problem,), readable=False)
    # A store of this template given by name (`relayer dashboard tenants.acme --template
    # tenants`) is the one its row yields, not another store on its tables.
    others = {
        where: store for where, store in (taken or {}).items() if not store.startswith(f"{name}.")
    }
    found, skipped = validate_rows(template, rows, others)
    problems = tuple(
        StoreSummary(f"{name}.?", error=f"a row is skipped: {_first_line(exc)}") for exc in skipped
    )
    stores = tuple(store.settings for store in found.values())
    return TemplateListing(name, stores, problems, readable=True)


async def fleet_stores(
    stores: Sequence[StoreSettings], templates: Sequence[TemplateSettings]
) -> tuple[list[StoreSettings], list[StoreSummary]]:
    """The stores of ``relayer status --all`` and of the dashboard's Fleet page: ``stores``
    and every store a template's source lists now (the sources read at once); and a line for
    each source that cannot be read or row that breaks a rule (the others are still read)."""
    from relayer.fleet.templates import tables_of

    taken = {tables_of(store): store.name for store in stores}
    listings = await asyncio.gather(*(list_template(template, taken) for template in templates))
    found = list(stores)
    problems: list[StoreSummary] = []
    for listing in listings:
        found.extend(listing.stores)
        problems.extend(listing.problems)
    return found, problems


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return redact(text.splitlines()[0]) if text else type(exc).__name__


__all__ = [
    "SUMMARY_CONNECTIONS",
    "SUMMARY_TIMEOUT",
    "LanePending",
    "Member",
    "StoreStatus",
    "StoreSummary",
    "TemplateListing",
    "fleet_stores",
    "list_template",
    "read_status",
    "read_summaries",
    "read_summary",
]
