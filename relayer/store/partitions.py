"""Partitioned storage's tables (docs/storage.md): creating a partitioned store, telling a
store's storage mode from its outbox, and rotating its partitions.

The outbox of a partitioned store is partitioned by range of id. Ids are UUIDv7, whose first
48 bits are a Unix time in milliseconds, so a partition's bounds are UUIDs built from a time
with every other bit zero, a whole ``partition_span`` apart; the first partition reaches down
to MINVALUE (ids of a clock behind the database's). There is no DEFAULT partition (DETACH
CONCURRENTLY refuses to run beside one): partitions are created PARTITIONS_AHEAD spans ahead
of the database clock, when the store is created and at every rotation.

Rotation (:func:`rotate`, the store's cleanup leader every ``cleanup_interval``): finish any
detach left half done (``DETACH ... FINALIZE``), create the partitions ahead, then detach
(``DETACH ... CONCURRENTLY``) and drop each partition whose upper bound is at or below every
lane's progress, once the rows of transactions that were still open then are copied into the
held table. Each step is idempotent, so rotation may be run twice at once or die halfway.
A new partition is a CREATE TABLE ... (LIKE ...) then ATTACH PARTITION, which takes SHARE
UPDATE EXCLUSIVE on the outbox (CREATE TABLE ... PARTITION OF takes ACCESS EXCLUSIVE, which
would queue every writer and worker behind it); every step that locks the outbox runs with
``lock_timeout`` so that it gives up instead of queueing in front of writers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

import psycopg
from psycopg import sql

from relayer.errors import ConfigurationError, StoreError
from relayer.settings import StoreSettings
from relayer.sql import compose, compose_with, queries_for
from relayer.store.driver import Connection, connect

# Partitions kept ahead of the database clock: a writer finds its partition for this many
# spans (100 minutes at the default 10-minute span) even if no worker rotates meanwhile.
PARTITIONS_AHEAD = 10
# How long a rotation step waits for a lock on the outbox before giving up (it is tried again
# at the next rotation): short, so that writers and workers never queue behind it.
ROTATION_LOCK_TIMEOUT = "200ms"
# The comment rotation puts on a partition before it detaches it to drop it.
DROPPING = "relayer: passed by every lane; being detached and dropped"
STORAGE_PROCEDURE = "docs/storage.md#moving-a-store-between-modes"
_UPPER = re.compile(r"TO \('([0-9a-f-]{36})'\)")
_LOWER = re.compile(r"FROM \('([0-9a-f-]{36})'\)")


def uuid_at(ms: int) -> UUID:
    """The smallest UUIDv7-ordered value of Unix millisecond ``ms``: a partition bound."""
    return UUID(int=ms << 80)


def ms_of(bound: UUID) -> int:
    """The Unix millisecond a partition bound was built from."""
    return bound.int >> 80


@dataclass(frozen=True, slots=True)
class Partition:
    name: str
    lower: UUID | None  # None: MINVALUE
    upper: UUID
    detach_pending: bool


@dataclass(frozen=True, slots=True)
class Rotation:
    """What one rotation did."""

    created: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    finalized: tuple[str, ...] = ()  # half-done detaches finished, leftovers dropped
    skipped: str | None = None  # why a step gave up (a lock not granted in time)


async def storage_of(conn: Connection, store: StoreSettings) -> str | None:
    """The storage mode ``store``'s outbox has: "partitioned", "delete", or None (missing)."""
    names = store.names
    cursor = await conn.execute(
        queries_for(names)["partitioned_storage_of"],
        {"schema": names.schema, "table": names.table("outbox")},
    )
    row = await cursor.fetchone()
    return None if row is None else storage_of_relkind(row[0])


def storage_of_relkind(relkind: str | None) -> str | None:
    """The storage mode of an outbox of this pg_class relkind (None: no outbox)."""
    if relkind is None:
        return None
    return "partitioned" if relkind == "p" else "delete"


def check_storage(store: StoreSettings, found: str | None) -> None:
    """Refuse a store configured for one storage mode whose outbox has the other (exit 2)."""
    if found is None or found == store.storage:
        return
    raise ConfigurationError(
        f"stores.{store.name}.storage",
        store.storage,
        f"the store's outbox ({store.db_schema}.{store.names.table('outbox')}) was created for "
        f"storage = {found!r}; a store changes mode only by the procedure in {STORAGE_PROCEDURE}",
    )


async def create_tables(conn: Connection, store: StoreSettings) -> None:
    """Make a store just created by apply (inside its transaction) a partitioned one: the
    partitioned outbox, the progress and held tables, and the first partitions."""
    queries = queries_for(store.names)
    await conn.execute(queries["partitioned_create_tables"])
    await ensure_partitions(conn, store)


async def ensure_partitions(conn: Connection, store: StoreSettings) -> tuple[str, ...]:
    """Create the partitions missing from the last one's upper bound (or, for a new store, from
    MINVALUE) to PARTITIONS_AHEAD spans past the database clock; their names."""
    span = int(store.partition_span.total_seconds() * 1000)
    cursor = await conn.execute(queries_for(store.names)["partitioned_clock"])
    row = await cursor.fetchone()
    assert row is not None
    now_ms = int(row[0])
    partitions = await list_partitions(conn, store)
    start = max((ms_of(p.upper) for p in partitions), default=None)
    first = now_ms // span * span
    target = first + (PARTITIONS_AHEAD + 1) * span
    created: list[str] = []
    if start is None:
        created.append(await _attach(conn, store, None, first))
        start = first
    while start < target:
        upper = (start // span + 1) * span
        created.append(await _attach(conn, store, start, upper))
        start = upper
    return tuple(created)


async def list_partitions(conn: Connection, store: StoreSettings) -> list[Partition]:
    """The outbox's partitions, lowest first."""
    names = store.names
    cursor = await conn.execute(
        queries_for(names)["partitioned_list_partitions"],
        {"parent": f'"{names.schema}"."{names.table("outbox")}"'},
    )
    found: list[Partition] = []
    for name, bound, pending in await cursor.fetchall():
        upper = _UPPER.search(bound)
        if upper is None:  # not a partition of ours (MAXVALUE): never rotated
            continue
        lower = _LOWER.search(bound)
        found.append(
            Partition(str(name), UUID(lower[1]) if lower else None, UUID(upper[1]), bool(pending))
        )
    return sorted(found, key=lambda partition: partition.upper)


async def _attach(
    conn: Connection, store: StoreSettings, lower_ms: int | None, upper_ms: int
) -> str:
    """Create one partition as a table of the outbox's shape and attach it (SHARE UPDATE
    EXCLUSIVE on the outbox: writers and workers go on)."""
    names = store.names
    label = "floor" if lower_ms is None else f"{lower_ms // 60_000:08d}"
    name = f"{names.prefix}op_{label}"
    table = sql.Identifier(names.schema, name)
    lower = sql.SQL("MINVALUE") if lower_ms is None else sql.Literal(str(uuid_at(lower_ms)))
    await conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
            "INCLUDING INDEXES)"
        ).format(table, sql.Identifier(names.schema, names.table("outbox")))
    )
    await conn.execute(
        compose("ALTER TABLE {outbox} ATTACH PARTITION ", names)
        + sql.SQL("{} FOR VALUES FROM ({}) TO ({})").format(
            table, lower, sql.Literal(str(uuid_at(upper_ms)))
        )
    )
    return name


async def rotate(store: StoreSettings, *, settle: timedelta | None = None) -> Rotation:
    """One rotation of a partitioned store's partitions, on a connection of its own (autocommit,
    through ``admin_dsn`` if set: DETACH CONCURRENTLY cannot run in a transaction block, and
    its lock_timeout is a session setting, which a transaction pooler would not keep).

    A partition goes only once its upper bound is ``settle`` (default: one partition_span)
    behind the database clock, so none that writers may still be writing into is dropped.
    StoreError for database trouble; a lock not granted in time ends the rotation early
    (``skipped``, tried again at the next one), and so does another rotation in progress."""
    if settle is None:
        settle = store.partition_span
    if store.pooler == "transaction" and not store.admin_dsn:
        # A session's advisory lock and lock_timeout would stay on a pooled server connection.
        return Rotation(
            skipped="rotation needs a session of its own, which a pooler in transaction mode "
            f"does not give (pooler = 'transaction'); set stores.{store.name}.admin_dsn to a "
            "direct connection or a session-mode pool"
        )
    conn = await connect(store, autocommit=True, purpose="rotate", dsn=store.admin_dsn)
    try:
        await conn.execute(
            sql.SQL("SET lock_timeout = {}").format(sql.Literal(ROTATION_LOCK_TIMEOUT))
        )
        cursor = await conn.execute(
            queries_for(store.names)["partitioned_rotation_lock"], {"key": _rotation_lock(store)}
        )
        locked = await cursor.fetchone()
        if not (locked and locked[0]):
            return Rotation(skipped="another rotation of this store is in progress")
        return await _rotate(conn, store, int(settle.total_seconds() * 1000))
    except psycopg.errors.LockNotAvailable as exc:
        return Rotation(skipped=exc.diag.message_primary or str(exc))
    except psycopg.errors.InsufficientPrivilege as exc:
        return Rotation(
            skipped=f"{exc.diag.message_primary or exc}: only the tables' owner may create and "
            f"drop partitions; set stores.{store.name}.admin_dsn to a connection as the owner "
            "(the partitions ahead run out otherwise)"
        )
    except psycopg.Error as exc:
        raise StoreError(f"store {store.name!r}: rotate partitions: {exc}") from exc
    finally:
        await conn.close()  # and with it the session's advisory lock


def _rotation_lock(store: StoreSettings) -> int:
    """The advisory-lock key of ``store``'s rotation (the schema lock's, one bit flipped)."""
    return store.names.lock_key ^ (1 << 62)


async def _rotate(conn: Connection, store: StoreSettings, settle_ms: int) -> Rotation:
    names = store.names
    detach = compose("ALTER TABLE {outbox} DETACH PARTITION ", names)
    finalized: list[str] = []
    for partition in await list_partitions(conn, store):
        if partition.detach_pending:  # a DETACH CONCURRENTLY that did not finish
            table = sql.Identifier(names.schema, partition.name)
            await conn.execute(detach + sql.SQL("{} FINALIZE").format(table))
            await _drop_detached(conn, store, partition.name)
            finalized.append(partition.name)
    cursor = await conn.execute(
        queries_for(names)["partitioned_leftovers"],
        {"schema": names.schema, "prefix": f"{names.prefix}op_", "mark": DROPPING},
    )
    for (leftover,) in await cursor.fetchall():  # detached by a rotation that died: drop it
        await _drop_detached(conn, store, leftover)
        finalized.append(leftover)
    async with conn.transaction():
        created = await ensure_partitions(conn, store)
    cursor = await conn.execute(queries_for(names)["partitioned_low_water"])
    row = await cursor.fetchone()
    assert row is not None
    limit = uuid_at(int(row[1]) - settle_ms)
    if row[0] is not None:
        limit = min(limit, UUID(row[0]))
    dropped: list[str] = []
    # The highest partition stays, whatever the progress: writers always find one.
    for partition in (await list_partitions(conn, store))[:-1]:
        if partition.upper > limit:
            break
        table = sql.Identifier(names.schema, partition.name)
        # Marked first (SHARE UPDATE EXCLUSIVE on the partition: readers and writers go on), so
        # that a rotation ending between the detach and the drop leaves a table the next one
        # knows it may drop.
        await conn.execute(
            sql.SQL("COMMENT ON TABLE {} IS {}").format(table, sql.Literal(DROPPING))
        )
        await conn.execute(detach + sql.SQL("{} CONCURRENTLY").format(table))
        await _drop_detached(conn, store, partition.name)
        dropped.append(partition.name)
    return Rotation(tuple(created), tuple(dropped), tuple(finalized))


async def _drop_detached(conn: Connection, store: StoreSettings, name: str) -> None:
    """Drop a partition rotation detached, once its pending rows are in the held table: the
    rows of writers whose transactions were open when rotation found the partition passed
    (the detach waited for them to end), in one transaction with the drop."""
    names = store.names
    table = sql.Identifier(names.schema, name)
    rescue = compose_with("partitioned_rescue", names, partition=table)
    async with conn.transaction():
        await conn.execute(rescue)
        await conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
