"""The connections the stores of one database share in a worker, and the bound on them.

Stores reach the same database when their connection target is the same: the same ``dsn``
(compared parameter by parameter), ``listen_dsn`` and ``pooler``, and, without a transaction
pooler, the same start-up settings of batch connections (they follow ``lease_duration``).
Stores in other schemas or with other table prefixes of that database share:

- one *housekeeping* connection (autocommit) for every store's heartbeats, probes, schema
  check and maintenance looks (for unordered rows to recover, and the cleanup's health read);
  heartbeats go before waiting probes (relayer.store.connections.Turns), and the stores'
  heartbeats and idle probes of one event-loop turn go together (relayer.store.housekeeping);
- one LISTEN connection, LISTENing on each store's channel (none behind a transaction pooler
  without ``listen_dsn``: the stores then poll every ``poll_interval``);
- one dispatcher connection for the stores' pause flags and concurrency limits
  (relayer.dispatch.dispatcher, kept by the worker);
- one :class:`~relayer.store.budget.BatchPool` of transaction connections, opened on demand
  and closed after ``worker.batch_max_idle`` unused.

The fixed connections (housekeeping, LISTEN, dispatcher) are held while any store of the
database is served: the first store in reserves them in the worker's budget, the last one
out closes them. So a worker holds at most ``max_connections``: per database 2 or 3 fixed
connections, plus the batch connections of every database (one per lane batch in flight, and
the metrics' backlog reads), sharing what the budget leaves (:func:`plan_connections`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from psycopg.conninfo import conninfo_to_dict

from relayer.deadlines import Deadlines
from relayer.errors import ConfigurationError
from relayer.settings import StoreSettings, WorkerSettings
from relayer.store.budget import BatchPool, ConnectionBudget
from relayer.store.connections import Session, batch_settings, can_listen
from relayer.store.driver import Connection, connect
from relayer.store.housekeeping import Housekeeping
from relayer.store.idle import IdleWatch
from relayer.store.joins import JoinBatches
from relayer.store.listener import SharedListener
from relayer.store.severance import Severance

logger = logging.getLogger(__name__)

Parameters = tuple[tuple[str, str], ...]

# Statements the housekeeping connection keeps prepared besides each store's heartbeat (which
# it always keeps): psycopg's default, for the statements it prepares by itself once they ran
# a few times.
HOUSEKEEPING_PREPARED = 100
# Seconds a stopping worker gives its jobs to end once their connections are cut, before it
# cancels them (a cancelled statement would ask a silent server to cancel it).
CUT_GRACE = 0.5


@dataclass(frozen=True, slots=True)
class DatabaseKey:
    """What stores must have in common to share connections (no secret shows in its repr)."""

    target: Parameters = field(repr=False)
    listen: Parameters | None = field(repr=False)
    pooler: str
    options: Parameters
    label: str = field(compare=False)


# Keys found, by the id of the settings (kept beside, so that the id is not reused meanwhile):
# a worker serving hundreds of stores plans its connections again as each joins or leaves.
_KEYS: dict[int, tuple[StoreSettings, DatabaseKey]] = {}
KEYS_KEPT = 4096


def database_key(store: StoreSettings) -> DatabaseKey:
    found = _KEYS.get(id(store))
    if found is not None and found[0] is store:
        return found[1]
    key = _database_key(store)
    if len(_KEYS) >= KEYS_KEPT:
        del _KEYS[next(iter(_KEYS))]  # the oldest entry
    _KEYS[id(store)] = (store, key)
    return key


def _database_key(store: StoreSettings) -> DatabaseKey:
    options = tuple(sorted(batch_settings(store).items())) if store.pooler == "none" else ()
    listen = _parameters(store.listen_dsn) if store.listen_dsn else None
    return DatabaseKey(
        _parameters(store.require_dsn()),
        listen,
        store.pooler,
        options,
        database_label(store.require_dsn()),
    )


@functools.lru_cache(maxsize=1024)
def _parameters(dsn: str) -> Parameters:
    # Cached: a worker serving hundreds of stores plans its connections again as each one
    # joins or leaves, and parsing every store's DSN each time grew with the square of them.
    return tuple(sorted((name, str(value)) for name, value in conninfo_to_dict(dsn).items()))


@functools.lru_cache(maxsize=1024)
def database_label(dsn: str) -> str:
    """``user@host:port/dbname`` of ``dsn``, for logs (never its password)."""
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or params.get("hostaddr") or "localhost").split(",")[0]
    port = str(params.get("port") or "5432").split(",")[0]
    user = f"{params['user']}@" if params.get("user") else ""
    return f"{user}{host}:{port}/{params.get('dbname') or ''}"


def fixed_connections(store: StoreSettings, *, dispatcher: bool) -> int:
    """The connections a database of ``store`` holds while it is served, batches aside:
    housekeeping, LISTEN (if it can be kept) and dispatcher (unless the worker was given a
    cluster state of its own)."""
    return 1 + int(can_listen(store)) + int(dispatcher)


@dataclass(frozen=True, slots=True)
class ConnectionPlan:
    """How a worker's connections divide: ``fixed`` in all for ``databases`` databases and
    ``outside`` connections to other databases (discovery catalogs), up to ``batch`` batch
    connections (shared by the databases), ``slots`` lane batches at once. ``limit`` is
    ``max_connections``, or ``fixed + batch`` when it is unset."""

    databases: int
    fixed: int  # ``outside`` included
    batch: int
    slots: int
    limit: int
    configured: bool  # max_connections was set
    outside: int = 0

    def describe(self) -> str:
        source = "worker.max_connections" if self.configured else "computed: max_connections unset"
        catalogs = f" and {self.outside} for discovery catalog reads" if self.outside else ""
        return (
            f"at most {self.limit} connections to PostgreSQL ({source}): "
            f"{self.fixed - self.outside} for {self.databases} database(s) (housekeeping, "
            f"LISTEN, dispatcher){catalogs}, and up to {self.limit - self.fixed} batch "
            f"connections shared by them, {self.slots} lane batches at once"
        )


def plan_connections(
    stores: Iterable[StoreSettings],
    settings: WorkerSettings,
    *,
    dispatcher: bool = True,
    outside: int = 0,
) -> ConnectionPlan:
    """The worker's connection plan for ``stores`` and ``outside`` connections it opens to
    other databases (a template's catalog read each, one at a time); ConfigurationError when
    ``max_connections`` cannot hold every database's fixed connections, those outside and one
    batch connection per database."""
    databases: dict[DatabaseKey, StoreSettings] = {}
    for store in stores:
        databases.setdefault(database_key(store), store)
    fixed = outside
    fixed += sum(fixed_connections(store, dispatcher=dispatcher) for store in databases.values())
    limit = settings.max_connections
    if limit is None:
        batch = settings.pool_size
        return ConnectionPlan(len(databases), fixed, batch, batch, fixed + batch, False, outside)
    batch = limit - fixed
    needed = fixed + max(len(databases), 1 if outside else 0)
    if limit < needed:
        catalogs = f", plus {outside} for discovery catalog reads," if outside else ""
        raise ConfigurationError(
            "worker.max_connections",
            limit,
            f"must be at least {needed} for these stores: their "
            f"{len(databases)} database(s) hold {fixed - outside} connections of their own "
            "(housekeeping, LISTEN and dispatcher, per database; no LISTEN behind a "
            f"transaction pooler without listen_dsn){catalogs} plus at least one batch "
            "connection each; raise it, or serve fewer databases per process",
        )
    slots = min(settings.pool_size, batch)
    return ConnectionPlan(len(databases), fixed, batch, slots, limit, True, outside)


class Database:
    """The connections the stores of one database share in a worker (see the module
    docstring). ``attach`` a store before it uses them and ``detach`` it after."""

    def __init__(
        self, key: DatabaseKey, store: StoreSettings, budget: ConnectionBudget, max_idle: float
    ) -> None:
        self.key = key
        self.label = key.label
        self.budget = budget
        self._template = store
        # Every connection of the database, cut when a stopping worker stops waiting for it.
        self.severance = Severance(store, key.label)
        self.housekeeping = Session(store, self._connect_housekeeping, purpose="housekeeping")
        self.batched = Housekeeping(
            self.housekeeping, prepare=store.pooler != "transaction", label=key.label
        )
        # Idle stores polled together.
        self.idle = IdleWatch(self.housekeeping, prepare=store.pooler != "transaction")
        # Stores joining together check their schemas together.
        self.joins = JoinBatches(self.joining)
        self.listener = (
            SharedListener(
                store,
                label=key.label,
                name=lambda: self.application("listen"),
                guard=self.severance.connect,
            )
            if can_listen(store)
            else None
        )
        self.pool = BatchPool(
            budget,
            store,
            name=lambda: self.application("batch"),
            settings=batch_settings(store),
            max_idle=max_idle,
            # Connecting must end well within a lease: the scan waiting for it holds a slot.
            timeout=max(Deadlines.of(store.lease_duration).connection_wait, 1.0),
            guard=self.severance.connect,
        )
        self.stores: dict[str, StoreSettings] = {}
        self._reserved = 0

    def __repr__(self) -> str:
        return f"Database({self.label!r}, stores={sorted(self.stores)})"

    def application(self, purpose: str) -> str:
        """What a connection made now for ``purpose`` is named after (``relayer:NAME`` in
        pg_stat_activity): the database's first store, and how many more it serves, as in
        ``relayer:orders+19:batch`` (``relayer:orders:batch`` for a store on its own)."""
        names = list(self.stores) or [self._template.name]
        more = f"+{len(names) - 1}" if len(names) > 1 else ""
        return f"{names[0]}{more}:{purpose}"

    async def _connect_housekeeping(self) -> Connection:
        purpose = self.application("housekeeping")
        return await self.severance.connect(
            lambda: connect(self._template, purpose=purpose), "housekeeping (connecting)"
        )

    async def connect_dispatcher(self) -> Connection:
        """A new autocommit connection for the database's dispatcher (relayer.dispatch:
        the worker shares one per database; it reserves its own unit of the budget)."""
        purpose = self.application("dispatcher")
        return await self.severance.connect(
            lambda: connect(self._template, purpose=purpose), "dispatcher (connecting)"
        )

    @property
    def fixed(self) -> int:
        """Units this database reserves while served (its dispatcher reserves its own)."""
        return 1 + int(self.listener is not None)

    async def attach(self, store: StoreSettings) -> None:
        """``store`` starts using the shared connections (the first one in reserves them)."""
        if not self.stores:
            try:
                while self._reserved < self.fixed:
                    await self.budget.reserve()
                    self._reserved += 1
            except BaseException:  # cancelled while waiting for room: hold nothing
                self._unreserve()
                raise
            self.pool.open()
        self.stores[store.name] = store
        self.housekeeping.keep_prepared(HOUSEKEEPING_PREPARED + len(self.stores))

    @asynccontextmanager
    async def joining(self, store: StoreSettings) -> AsyncIterator[Connection]:
        """A connection for the schema check of stores joining (a batch of them,
        relayer.store.joins, or ``store`` alone), committed at the end: a batch connection
        when the pool has one free at once, so that a long check does not hold up the
        heartbeats on the housekeeping connection (and checks alone go side by side), else
        the housekeeping connection."""
        pool = self.pool.for_store(store)
        if pool.available() > 0:
            async with pool.connection("join: check the schema", wait=0) as conn:
                yield conn
                await conn.commit()
            return
        session = self.housekeeping.for_store(store)
        async with session.connection("join: check the schema", urgent=True) as conn:
            yield conn

    async def detach(self, store: StoreSettings) -> None:
        """``store`` is done with them; the last one out closes them."""
        if self.stores.pop(store.name, None) is None:
            return
        if self.listener is not None:
            await self.listener.unsubscribe(store)
        if self.stores:
            self.housekeeping.keep_prepared(HOUSEKEEPING_PREPARED + len(self.stores))
            return
        await self.batched.close()
        await self.idle.close()
        await self.joins.close()
        await self.housekeeping.close()
        await self.pool.close()
        self._unreserve()

    def _unreserve(self) -> None:
        while self._reserved:
            self._reserved -= 1
            self.budget.unreserve()


class Databases:
    """A worker's databases by :func:`database_key`, drawing on one ConnectionBudget."""

    def __init__(self, settings: WorkerSettings, limit: int | None = None) -> None:
        self.settings = settings
        self.budget = ConnectionBudget(limit)
        self.max_idle = settings.batch_max_idle.total_seconds()
        self._databases: dict[DatabaseKey, Database] = {}
        # Connections to databases with no store here, counted in the plan (discovery
        # catalogs: Worker.count_outside), each opened under outside_connection().
        self.outside = 0

    @asynccontextmanager
    async def outside_connection(self) -> AsyncIterator[None]:
        """A unit of the budget for one connection to a database outside these, held for the
        block: at once while the budget has room, else by closing an idle batch connection,
        else once a batch connection is returned (reservations go before batches)."""
        await self.budget.reserve()
        try:
            yield
        finally:
            self.budget.unreserve()

    def get(self, store: StoreSettings) -> Database:
        key = database_key(store)
        database = self._databases.get(key)
        if database is None:
            database = self._databases[key] = Database(key, store, self.budget, self.max_idle)
        return database

    def __iter__(self) -> Iterator[Database]:
        return iter(self._databases.values())

    def cut(self) -> None:
        """Sever every connection to every database and refuse new ones: a stopping worker
        spent its stop budget (relayer.store.severance)."""
        for database in self:
            database.severance.cut()

    def cut_at(self, when: float) -> None:
        """:meth:`cut` at ``when`` (time.monotonic()), unless the worker is gone by then."""
        asyncio.get_running_loop().call_later(max(when - time.monotonic(), 0.0), self.cut)
