"""What the dashboard reads on request: a lane, a page of parked keys, a key, a row's body,
the holders of the queues' slots, the index sizes, the schema drift and the audit trail.

Every statement is a named query of ``relayer/sql/dashboard.sql`` (or the drift check of
relayer.store.drift); counts are capped at COUNT_CAP, error texts and reasons redacted. Driver
errors become StoreError in the driver's own words. The dashboard puts these reads together
with the queue controls' and the table health's (relayer.dashboard.views).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from relayer.identifiers import TABLE_SUFFIXES
from relayer.redact import redact
from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.store.dashboard import COUNT_CAP, Capped, without_jit
from relayer.store.drift import check
from relayer.store.driver import Connection, translated_verbatim

PAGE_SIZE = 50
ROWS_SHOWN = 20
BODY_CAP = 4096  # bytes of a body shown when asked for
PARKED_STATES = ("retrying", "operator")


@dataclass(frozen=True, slots=True)
class RowView:
    id: UUID
    key: str | None
    transport: str | None
    destination: str
    attempts: int
    last_error: str | None
    deliver_at: datetime | None
    created_at: datetime
    size: int
    future: bool


@dataclass(frozen=True, slots=True)
class ParkedView:
    key: str
    lane: int
    attempts: int
    last_error: str
    retry_at: datetime | None
    parked_at: datetime
    head_id: UUID
    destination: str | None
    transport: str | None

    @property
    def waiting_for_operator(self) -> bool:
        return self.retry_at is None


@dataclass(frozen=True, slots=True)
class LaneDetail:
    lane: int
    owner: str | None
    lease_live: bool
    lease_expires: datetime | None
    lease_acquired: datetime | None
    rows: tuple[RowView, ...]
    pending: Capped
    parked: tuple[ParkedView, ...]
    reasons: tuple[str, ...]  # why this lane is not moving, when it is not


@dataclass(frozen=True, slots=True)
class ParkedFilter:
    error: str | None = None
    lane: int | None = None
    destination: str | None = None
    transport: str | None = None
    state: str | None = None  # 'retrying' or 'operator'

    def params(self) -> dict[str, Any]:
        return {
            "error": self.error,
            "lane": self.lane,
            "destination": self.destination,
            "transport": self.transport,
            "state": self.state,
        }

    def query(self) -> dict[str, str]:
        """The filter as URL query parameters (only those set)."""
        return {name: str(value) for name, value in self.params().items() if value is not None}


@dataclass(frozen=True, slots=True)
class ParkedPage:
    keys: tuple[ParkedView, ...]
    matching: Capped
    as_of: datetime
    next_after: tuple[datetime, str] | None


@dataclass(frozen=True, slots=True)
class ErrorGroup:
    error: str  # the first 200 characters the group's keys share
    keys: int
    operator: int
    since: datetime
    example: str  # the whole error of one of its keys (at most 2,000 characters)


@dataclass(frozen=True, slots=True)
class KeyDetail:
    parked: ParkedView
    updated_at: datetime
    rows: tuple[RowView, ...]
    pending: Capped


@dataclass(frozen=True, slots=True)
class Body:
    text: str
    size: int
    truncated: bool
    binary: bool
    headers: str


@dataclass(frozen=True, slots=True)
class Holder:
    queue: str
    slot: int
    pid: int
    application: str
    client: str
    since: datetime


@dataclass(frozen=True, slots=True)
class IndexSize:
    table: str
    index: str
    size_bytes: int
    scans: int


@dataclass(frozen=True, slots=True)
class AuditEntry:
    occurred_at: datetime
    source: str
    actor: str
    action: str
    target: str
    rows: int | None
    reason: str | None
    outcome: str
    detail: str | None


def _rows(records: list[tuple[Any, ...]]) -> tuple[RowView, ...]:
    return tuple(
        RowView(
            r[0],
            r[1],
            r[2],
            r[3],
            int(r[4]),
            redact(r[5]) if r[5] else None,
            r[6],
            r[7],
            int(r[8]),
            bool(r[9]),
        )
        for r in records
    )


def _parked(r: tuple[Any, ...]) -> ParkedView:
    return ParkedView(r[0], int(r[1]), int(r[2]), redact(r[3]), r[4], r[5], r[6], r[7], r[8])


def _count(row: tuple[Any, ...] | None) -> Capped:
    return Capped.of(int(row[0]) if row else 0)


async def read_lane(conn: Connection, store: StoreSettings, lane: int) -> LaneDetail:
    """``lane``'s lease, first rows, capped pending count and parked keys (no reasons yet:
    they need the latest snapshot, relayer.dashboard.views)."""
    queries = queries_for(store.names, store.storage)
    with translated_verbatim():
        async with without_jit(conn, store):
            cursor = await conn.execute(queries["dash_lane_lease"], {"lane": lane})
            lease = await cursor.fetchone()
            cursor = await conn.execute(
                queries["dash_lane_rows"], {"lane": lane, "limit": ROWS_SHOWN}
            )
            rows = _rows(await cursor.fetchall())
            cursor = await conn.execute(
                queries["dash_lane_pending"], {"lane": lane, "cap": COUNT_CAP + 1}
            )
            pending = _count(await cursor.fetchone())
    page = await parked_page(conn, store, ParkedFilter(lane=lane), limit=ROWS_SHOWN)
    live = bool(lease and lease[4] and lease[0])
    owner = str(lease[0]) if lease and lease[0] else None
    return LaneDetail(
        lane=lane,
        owner=owner if live else None,
        lease_live=live,
        lease_expires=lease[1] if lease and live else None,
        lease_acquired=lease[2] if lease and live else None,
        rows=rows,
        pending=pending,
        parked=page.keys,
        reasons=(),
    )


async def parked_page(
    conn: Connection,
    store: StoreSettings,
    where: ParkedFilter,
    *,
    as_of: datetime | None = None,
    after: tuple[datetime, str] | None = None,
    limit: int = PAGE_SIZE,
) -> ParkedPage:
    """One keyset page of the keys matching ``where`` as of ``as_of`` (None: now, the moment
    a search begins), after the key ``after`` (parked_at, key) of the page before."""
    queries = queries_for(store.names, store.storage)
    with translated_verbatim():
        if as_of is None:
            cursor = await conn.execute(queries["dash_now"])
            row = await cursor.fetchone()
            assert row is not None
            as_of = row[0]
        params = {
            **where.params(),
            "as_of": as_of,
            "after_at": after[0] if after else None,
            "after_key": after[1] if after else None,
            "limit": limit + 1,
        }
        async with without_jit(conn, store):
            cursor = await conn.execute(queries["dash_parked_page"], params)
            records = await cursor.fetchall()
            cursor = await conn.execute(
                queries["dash_parked_count"],
                {**where.params(), "as_of": as_of, "cap": COUNT_CAP + 1},
            )
            matching = _count(await cursor.fetchone())
    keys = tuple(_parked(r) for r in records[:limit])
    following = (keys[-1].parked_at, keys[-1].key) if len(records) > limit and keys else None
    assert as_of is not None
    return ParkedPage(keys, matching, as_of, following)


async def error_groups(conn: Connection, store: StoreSettings) -> tuple[ErrorGroup, ...]:
    """The errors most keys are parked with, top 20."""
    with translated_verbatim():
        cursor = await conn.execute(
            queries_for(store.names)["dash_parked_groups"], {"cap": COUNT_CAP * 10}
        )
        records = await cursor.fetchall()
    return tuple(
        ErrorGroup(redact(r[0]), int(r[1]), int(r[2]), r[3], redact(r[4])) for r in records
    )


async def key_detail(conn: Connection, store: StoreSettings, key: str) -> KeyDetail | None:
    """The parked ``key`` with its waiting rows (None: it is not parked)."""
    queries = queries_for(store.names, store.storage)
    with translated_verbatim():
        async with without_jit(conn, store):
            cursor = await conn.execute(queries["dash_parked_key"], {"key": key})
            row = await cursor.fetchone()
            if row is None:
                return None
            parked = ParkedView(
                row[0],
                int(row[1]),
                int(row[2]),
                redact(row[3]),
                row[4],
                row[5],
                row[6],
                row[8],
                row[9],
            )
            params = {"lane": parked.lane, "key": key}
            cursor = await conn.execute(queries["dash_key_rows"], {**params, "limit": PAGE_SIZE})
            rows = _rows(await cursor.fetchall())
            cursor = await conn.execute(
                queries["dash_key_pending"], {**params, "cap": COUNT_CAP + 1}
            )
            pending = _count(await cursor.fetchone())
    return KeyDetail(parked, row[7], rows, pending)


async def row_body(conn: Connection, store: StoreSettings, lane: int, row_id: UUID) -> Body | None:
    """The first BODY_CAP bytes of a row's body, as text (hex when not UTF-8)."""
    with translated_verbatim():
        cursor = await conn.execute(
            queries_for(store.names, store.storage)["dash_row_body"],
            {"lane": lane, "id": row_id, "cap": BODY_CAP},
        )
        row = await cursor.fetchone()
    if row is None:
        return None
    data, size = bytes(row[0]), int(row[1])
    try:
        text, binary = data.decode("utf-8"), False
    except UnicodeDecodeError:
        text, binary = data.hex(" ", 2), True
    return Body(text, size, size > len(data), binary, str(row[2]))


async def slot_holders(
    conn: Connection, store: StoreSettings, queues: Mapping[int, str]
) -> tuple[Holder, ...]:
    """Who holds the slots of ``queues`` (lock key -> queue name) now."""
    with translated_verbatim():
        cursor = await conn.execute(
            queries_for(store.names)["dash_queue_holders"], {"keys": list(queues)}
        )
        records = await cursor.fetchall()
    return tuple(
        Holder(queues.get(int(r[0]), "?"), int(r[1]), int(r[2]), str(r[3]), str(r[4]), r[5])
        for r in records
    )


async def index_sizes(conn: Connection, store: StoreSettings) -> tuple[IndexSize, ...]:
    """The size and scan count of every index of the store's tables."""
    with translated_verbatim():
        cursor = await conn.execute(
            queries_for(store.names)["dash_index_sizes"],
            {"schema": store.db_schema, "tables": [store.names.table(r) for r in TABLE_SUFFIXES]},
        )
        records = await cursor.fetchall()
    return tuple(IndexSize(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in records)


async def schema_drift(conn: Connection, store: StoreSettings) -> tuple[str, ...]:
    """Schema drift, or why it was not checked: the check compares with temporary tables,
    which a read-only role may not create."""
    with translated_verbatim():
        try:
            return tuple(str(item) for item in await check(conn, store))
        except psycopg.errors.InsufficientPrivilege:
            return ("not checked: the dashboard's database role may not create temporary tables",)


async def audit_entries(
    conn: Connection,
    store: StoreSettings,
    *,
    text: str | None = None,
    action: str | None = None,
    limit: int = 100,
) -> tuple[AuditEntry, ...]:
    """Every operator change (parked keys and queues), newest first, filtered."""
    with translated_verbatim():
        cursor = await conn.execute(
            queries_for(store.names)["dash_audit"], {"text": text, "action": action, "limit": limit}
        )
        records = await cursor.fetchall()
    return tuple(
        AuditEntry(
            r[0],
            str(r[1]),
            str(r[2]),
            str(r[3]),
            str(r[4]),
            r[5],
            redact(r[6]) if r[6] else None,
            str(r[7]),
            r[8],
        )
        for r in records
    )
