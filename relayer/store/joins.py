"""Stores of one database joining a worker together: their schema checks and lane rows in a few
round trips for all of them, instead of some twenty for each.

Before a worker serves a store it checks the store's schema (what
:func:`relayer.store.drift.require_meta` refuses: no schema, an old one, another lane count,
migrations whose text changed, tables that differ from what this version's migrations create)
and makes sure every lane has its lease row. The stores of one database that join together (a
worker starting on a template's stores, a refresh finding new ones) do it in one batch:

1. one statement: which of them have a metadata table, and their schemas' oids;
2. one pipeline, in a transaction with the search_path pinned: the metadata and the recorded
   migrations of all of them (a UNION ALL of their tables each), and the catalog of all their
   schemas (columns, indexes, constraints); the worker compares each store's tables with the
   expected catalog, built once per process (relayer.store.drift);
3. one pipeline, in one transaction: the lane rows of the stores whose check passed.

Each store gets its own outcome: a store whose schema is missing, old or drifted is refused with
its own error and the others join. If a statement of the batch fails (a store's tables cannot be
read, a lock on them is held past LOCK_TIMEOUT, the connection is lost), its stores check one by
one, each on its own, as a store joining alone did (``RelayStore.prepare``).

One batch runs at a time per database: the stores that ask while it runs go in the next one.
A batch is sent once an event-loop turn passed in which no more store asked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, LiteralString

from relayer.errors import RelayerError
from relayer.settings import StoreSettings
from relayer.sql import latest_version
from relayer.store.drift import (
    Catalog,
    catalog_drift,
    checked_tables,
    checksum_drift,
    drift_error,
    expected_catalog,
    index_definition,
)
from relayer.store.driver import DRIVER_ERRORS, Connection
from relayer.store.partitions import check_storage, storage_of_relkind
from relayer.store.relay import RelayStore
from relayer.store.schema import StoreMeta, meta_table, verify_meta
from relayer.tasks import cancel_all

logger = logging.getLogger(__name__)

# Stores in one batch at most (each is named in its statements).
JOIN_BATCH = 250
# How long a batch waits for a lock on a store's tables before its stores check one by one.
LOCK_TIMEOUT = "2s"

# What makes a batch fail as a whole (its stores then check alone).
_BATCH_ERRORS: tuple[type[Exception], ...] = (RelayerError, *DRIVER_ERRORS)
# What one store's check came to: True (checked, lane rows made), False (the batch could not
# tell: check alone), or why the store is refused.
Outcome = bool | RelayerError
Opener = Callable[[StoreSettings], AbstractAsyncContextManager[Connection]]


class JoinBatches:
    """The schema checks and lane rows of the stores of one database that join together (see
    the module docstring), each batch on a connection ``connection(store)`` lends."""

    def __init__(self, connection: Opener) -> None:
        self._connection = connection
        self._waiting: list[tuple[RelayStore, asyncio.Future[bool]]] = []
        self._running: asyncio.Future[None] | None = None
        # Batches sent, and the stores they checked (read by tests and diagnostics).
        self.batches = 0
        self.checked = 0
        self.sending = 0  # stores in the batch under way

    @property
    def queued(self) -> int:
        """Stores waiting for the next batch."""
        return len(self._waiting)

    async def check(self, store: RelayStore) -> bool:
        """Check ``store``'s schema and make its lane rows, with the other stores of the
        database that ask in this event-loop turn or while a batch runs. True when done; False
        when the batch could not tell (check on your own: ``RelayStore.prepare``). Raises the
        store's own trouble (SchemaNotAppliedError, LaneCountMismatchError, SchemaDriftError)."""
        if store.store.storage == "partitioned":
            return False  # its progress rows and partitioned catalog: RelayStore.prepare
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((store, future))
        if self._running is None:
            self._running = asyncio.ensure_future(self._run())
        return await future

    async def _run(self) -> None:
        try:
            # The stores that ask in this event-loop turn go together, and those that ask in
            # the turns after while one more asks in each (stores joining together pass their
            # dispatch gate one a turn).
            asked = -1
            while asked < len(self._waiting) < JOIN_BATCH:
                asked = len(self._waiting)
                await asyncio.sleep(0)
            while self._waiting:
                batch, self._waiting = self._waiting[:JOIN_BATCH], self._waiting[JOIN_BATCH:]
                batch = [(store, future) for store, future in batch if not future.done()]
                if batch:
                    await self._send(batch)
        finally:
            self._running = None
            waiting, self._waiting = self._waiting, []
            for _, future in waiting:  # stopped half-way: each checks on its own
                if not future.done():
                    future.set_result(False)

    async def _send(self, batch: list[tuple[RelayStore, asyncio.Future[bool]]]) -> None:
        stores = [store for store, _ in batch]
        outcomes: list[Outcome]
        self.sending = len(stores)
        try:
            async with self._connection(stores[0].store) as conn:
                outcomes = await check_stores(conn, stores)
        except _BATCH_ERRORS as exc:
            logger.debug(
                "the schema checks of %s joining stores failed together; each checks on its "
                "own: %s",
                len(stores),
                exc,
            )
            outcomes = [False] * len(stores)
        finally:
            self.sending = 0
        self.batches += 1
        self.checked += len(stores)
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, RelayerError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def close(self) -> None:
        """Stop the batch under way (the last store of the database left)."""
        if self._running is not None:
            await cancel_all([self._running])


@asynccontextmanager
async def _together(conn: Connection) -> AsyncIterator[None]:
    """One transaction sent as one pipeline: one round trip (results are read after)."""
    async with conn.pipeline(), conn.transaction():
        yield


def _union(stores: Sequence[RelayStore], places: Sequence[int], query: str) -> LiteralString:
    """A UNION ALL of ``query`` (rendered per store, its place bound) over ``places``."""
    return " UNION ALL ".join(stores[place].queries[query] for place in places)


async def check_stores(conn: Connection, stores: Sequence[RelayStore]) -> list[Outcome]:
    """Check ``stores`` (of ``conn``'s database) together and make the lane rows of those
    whose check passed: each store's outcome, in order. Driver errors propagate (the batch
    could not tell)."""
    queries = stores[0].queries
    names = [store.store.names for store in stores]
    async with _together(conn):
        cursor = await conn.execute(
            queries["join_tables"],
            (
                [meta_table(n) for n in names],
                [n.schema for n in names],
                [f'"{n.schema}"."{n.table("outbox")}"' for n in names],
            ),
        )
    rows = await cursor.fetchall()
    found = [(row[0], row[1]) for row in rows]
    kinds = [storage_of_relkind(row[2]) for row in rows]
    present = [place for place, (meta, _) in enumerate(found) if meta is not None]
    expected: dict[str, Catalog] = {}
    for place in present:  # built once per process and prefix (a rolled-back transaction)
        prefix = names[place].prefix
        if prefix not in expected:
            tables = checked_tables(names[place])
            expected[prefix] = await expected_catalog(conn, names[place], tables, latest_version())
    metas, recorded, catalogs = await _read(conn, stores, present, found)
    outcomes: list[Outcome] = []
    for place, store in enumerate(stores):
        try:
            meta = verify_meta(store.store, metas.get(place))
            check_storage(store.store, kinds[place])
            if meta.schema_version == latest_version():
                live = _tables_of(catalogs.get(found[place][1]), checked_tables(names[place]))
                drift = checksum_drift(recorded.get(place, {}))
                drift += catalog_drift(names[place], expected[names[place].prefix], live)
                if drift:
                    raise drift_error(store.store, drift)
        except RelayerError as exc:
            outcomes.append(exc)
            continue
        outcomes.append(True)
    return await _lane_rows(conn, stores, outcomes)


async def _read(
    conn: Connection, stores: Sequence[RelayStore], present: list[int], found: list[Any]
) -> tuple[dict[int, StoreMeta], dict[int, dict[int, str]], dict[int, Catalog]]:
    """The metadata and recorded migrations of the stores at ``present`` (by place), and the
    catalog of every schema found (by oid), in one round trip."""
    queries = stores[0].queries
    oids = sorted({int(schema) for _, schema in found if schema is not None})
    tables = sorted({table for store in stores for table in checked_tables(store.store.names)})
    metas: dict[int, StoreMeta] = {}
    recorded: dict[int, dict[int, str]] = {}
    if not present:
        return metas, recorded, {}
    async with _together(conn):
        await conn.execute(queries["pin_search_path"])
        await conn.execute(queries["join_lock_timeout"], (LOCK_TIMEOUT,))
        read = await conn.execute(_union(stores, present, "join_meta"), present)
        applied = await conn.execute(_union(stores, present, "join_migrations"), present)
        parts = [
            await conn.execute(queries[query], (oids, tables))
            for query in ("catalog_columns_of", "catalog_indexes_of", "catalog_constraints_of")
        ]
    for place, lanes, version in await read.fetchall():
        metas[int(place)] = StoreMeta(lanes=int(lanes), schema_version=int(version))
    for place, version, checksum in await applied.fetchall():
        recorded.setdefault(int(place), {})[int(version)] = str(checksum)
    return metas, recorded, await _catalogs(parts)


async def _catalogs(parts: Sequence[Any]) -> dict[int, Catalog]:
    """Each schema's catalog (by oid) from the rows of catalog_columns_of, catalog_indexes_of
    and catalog_constraints_of."""
    found: dict[int, Catalog] = {}

    def of(oid: Any) -> Catalog:
        catalog = found.get(int(oid))
        if catalog is None:
            catalog = found[int(oid)] = Catalog({}, {}, {})
        return catalog

    columns, indexes, constraints = parts
    for oid, table, column, type_name, not_null, default in await columns.fetchall():
        of(oid).columns.setdefault(table, {})[column] = (type_name, not_null, default)
    for oid, table, index, definition in await indexes.fetchall():
        of(oid).indexes.setdefault(table, {})[index] = index_definition(definition)
    for oid, table, definition in await constraints.fetchall():
        of(oid).constraints.setdefault(table, set()).add(definition)
    return found


def _tables_of(catalog: Catalog | None, tables: Sequence[str]) -> Catalog:
    """The part of a schema's catalog about ``tables`` (a store's, among others' in it)."""
    if catalog is None:
        return Catalog({}, {}, {})
    return Catalog(
        {table: catalog.columns[table] for table in tables if table in catalog.columns},
        {table: catalog.indexes[table] for table in tables if table in catalog.indexes},
        {table: catalog.constraints[table] for table in tables if table in catalog.constraints},
    )


async def _lane_rows(
    conn: Connection, stores: Sequence[RelayStore], outcomes: list[Outcome]
) -> list[Outcome]:
    """Make the lane rows of the stores checked, in one transaction (committed at once: other
    members joining the stores wait for them until then); if that fails, they check alone."""
    checked = [place for place, outcome in enumerate(outcomes) if outcome is True]
    if not checked:
        return outcomes
    try:
        async with _together(conn):
            for place in checked:
                store = stores[place]
                await conn.execute(store.queries["ensure_lane_rows"], {"lanes": store.store.lanes})
    except DRIVER_ERRORS as exc:
        logger.debug("the lane rows of %s joining stores failed: %s", len(checked), exc)
        for place in checked:
            outcomes[place] = False
    return outcomes
