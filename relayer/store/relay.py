"""The relay's side of the database: every statement the ordered protocol runs.

The relay, membership and scanning run SQL only through this module. It returns frozen value
objects (no driver rows travel further) and raises only relayer errors: driver errors become
StoreError (relayer.store.driver). Statements live in ``relayer/sql/relay.sql``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple
from uuid import UUID

import psycopg

from relayer.errors import FencedWriteError
from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.store import wire
from relayer.store.connections import batch_settings, local_settings
from relayer.store.drift import require_meta
from relayer.store.driver import DRIVER_ERRORS, Connection, hang_up, store_error, translated
from relayer.transports.base import OutboundBatch

# How the outcome statement's fence refuses to commit (relay.sql): it casts a text that starts
# with this mark to an integer, which fails with the text in the message. A plain SQL statement
# has no other way to raise; a function would need the TEMP privilege or a schema object.
FENCE_MARK = "relayer-fence: "


class LaneHead(NamedTuple):
    """What a probe learned about one lane, without taking any lock. A named tuple built
    straight from the probe's row (its columns are these fields, in order, as these types):
    a probe of a whole share returns one for every busy lane."""

    lane: int
    has_head: bool  # a sendable (non-parked) head row exists
    future: bool
    due_in: float
    owner: str | None
    lease_live: bool
    lease_left: float


class LaneRows:
    """The rows one batch read under its lanes' locks, as columns, in (lane, id) order.

    ``batch`` holds what a transport gets (ids as UUID text, keys, destinations, bodies,
    headers); beside it each row's lane, the transport it names (None: the store's default)
    and whether it is future-dated. Columns, not an object per row: a batch reads thousands
    of rows, and an object each cost more than sending them.
    """

    __slots__ = ("batch", "future", "lanes", "transports")

    def __init__(
        self,
        lanes: Sequence[int],
        batch: OutboundBatch,
        transports: Sequence[str | None],
        future: Sequence[bool],
    ) -> None:
        self.lanes = lanes
        self.batch = batch
        self.transports = transports
        self.future = future

    def __len__(self) -> int:
        return len(self.lanes)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Any]]) -> LaneRows:
        """From ``read_batch``'s rows: lane, id text, key, transport, destination, body,
        headers (JSON text, or None when empty), future. Each lane's rows come in id order and
        together; the lanes are put in ascending order here if they do not come so (the
        statement sorts nothing: a stable sort by lane keeps each lane's order)."""
        if not rows:
            return _NO_ROWS
        lanes, ids, keys, transports, destinations, bodies, headers, future = zip(
            *rows, strict=True
        )
        if list(lanes) != sorted(lanes):
            rows = sorted(rows, key=itemgetter(0))
            lanes, ids, keys, transports, destinations, bodies, headers, future = zip(
                *rows, strict=True
            )
        if any(headers):
            headers = tuple(None if text is None else json.loads(text) for text in headers)
        batch = OutboundBatch(ids, keys, destinations, bodies, headers)
        return cls(lanes, batch, transports, future)


@dataclass(frozen=True, slots=True)
class RowFailure:
    """A failed head row of a lane batch: its lane and id (UUID text), the error to record and
    whether retrying can help."""

    lane: int
    id: str
    error: str
    permanent: bool = False


@dataclass(frozen=True, slots=True)
class Outcomes:
    deleted: int
    failed: int
    gave_up: tuple[int, ...]  # the lane of each key that reached max_attempts
    unparked: int


class RelayStore:
    """The relay's statements for one store, with its identifiers composed once."""

    def __init__(self, store: StoreSettings) -> None:
        self.store = store
        self.queries = queries_for(store.names, store.storage)
        self.lease = store.lease_duration
        # Behind a transaction pooler each batch sets its own settings (else the pool's
        # connections carry them).
        self.local = local_settings(store, batch_settings(store))
        # A batch's statements go through relayer.store.wire; prepared on the server unless a
        # transaction pooler could hand the next transaction another server connection.
        self.wired = {
            name: wire.Statement(name, self.queries[name])
            for name in (
                "set_local",
                "lock_lanes",
                "read_batch",
                "record_outcomes",
                "probe",
                "probe_share",
            )
        }
        if store.storage == "partitioned":
            # Sent with the outcome statement, ahead of it (relayer/sql/partitioned.sql).
            self.wired["advance"] = wire.Statement("advance", self.queries["advance"])
        # An expression: one column of the idle watch's SELECT (``holds_rows``).
        self.holds_rows_query = self.queries["holds_rows"]
        self.prepare_batches = store.pooler != "transaction"

    async def prepare(self, conn: Connection) -> None:
        """Before serving the store: refuse a missing, old or drifted schema or another lane
        count (relayer.store.drift), and make sure every lane has its lease row (committed at
        once on a connection in a transaction: until then, other members joining the store
        would wait for the new rows)."""
        with translated(self.store, "check the schema"):
            await require_meta(conn, self.store)
            await conn.execute(self.queries["ensure_lane_rows"], {"lanes": self.store.lanes})
            if self.store.storage == "partitioned":
                await conn.execute(
                    self.queries["ensure_progress_rows"], {"lanes": self.store.lanes}
                )
            await conn.commit()

    async def heartbeat(
        self, conn: Connection, member: str, token: UUID, *, prepare: bool = False
    ) -> tuple[list[str], int]:
        """Renew ``member``, drop expired members and give up the held lanes outside the share
        the live members give it (as ``release_lanes``), in one statement: the live members in
        rank order, and how many lanes were released. ``prepare``: keep the statement prepared
        on ``conn`` (it runs every lease_duration / 3 for as long as the store is served)."""
        with translated(self.store, "heartbeat"):
            cursor = await conn.execute(
                self.queries["heartbeat"],
                {"member": member, "token": token, "lease": self.lease},
                prepare=True if prepare else None,
            )
            return _beat(await cursor.fetchall())

    async def release_lanes(self, conn: Connection, member: str, rank: int, members: int) -> int:
        """Give up the held lanes outside the share of the member at ``rank`` of ``members``
        (rank < 0: every lane)."""
        with translated(self.store, "release lanes"):
            cursor = await conn.execute(
                self.queries["release_lanes"],
                {"member": member, "rank": rank, "members": max(members, 1)},
            )
            return cursor.rowcount

    async def leave(self, conn: Connection, member: str) -> None:
        with translated(self.store, "leave"):
            await conn.execute(self.queries["leave"], {"member": member})

    async def probe(self, conn: Connection, lanes: Sequence[int]) -> list[LaneHead]:
        """Each of ``lanes``' head."""
        params = {"lanes": wire.text_list(lanes), "limit": 1}  # limit: partitioned storage's
        return await self._probe(conn, "probe", params, "probe lanes")

    async def probe_share(
        self,
        conn: Connection,
        rank: int,
        members: int,
        *,
        skip: Collection[int] = (),
        lanes: range | None = None,
    ) -> list[LaneHead]:
        """The heads of the lanes of the share of the member at ``rank`` of ``members`` that
        hold a row (found with a loose index scan: the cost follows busy lanes, not lanes),
        except the lanes of ``skip`` (their heads are known already: no head is looked up for
        them); only lanes in ``lanes`` (a range with step 1; default: every lane)."""
        if lanes is None:
            lanes = range(self.store.lanes)
        params = {
            "rank": rank,
            "members": max(members, 1),
            "skip": lane_bits(skip),
            "first": lanes.start,
            "end": lanes.stop,
            "limit": 1,  # partitioned storage's head read (one row)
        }
        return await self._probe(conn, "probe_share", params, "probe the share")

    async def _probe(
        self, conn: Connection, name: str, params: Mapping[str, Any], doing: str
    ) -> list[LaneHead]:
        """A probe on ``conn`` (autocommit) through the short path to the wire, as a batch's
        statements go: a hot store is probed every few milliseconds, and psycopg's cursors
        cost the client about twice as much a round trip."""
        with translated(self.store, doing):
            results = await wire.run(
                conn, [wire.Command(self.wired[name], params)], prepare=self.prepare_batches
            )
            return _heads(results.rows(0))

    async def lock_and_read(
        self,
        conn: Connection,
        lanes: Sequence[int],
        member: str,
        token: UUID,
        limit: int,
    ) -> tuple[dict[int, str], LaneRows]:
        """Take the leases of ``lanes`` (row-locked until the transaction ends) and read at
        most ``limit`` head rows of each lane taken.

        Returns each lane taken with its lease token (UUID text), and the rows of those lanes in
        (lane, id) order; a lane whose lease row is locked by another batch, or held by another
        live member, is left out. Must run inside a transaction on ``conn``.
        """
        params = {
            # Ascending: the read returns the lanes in this order (LaneRows.from_rows).
            "lanes": wire.text_list(sorted(lanes)),
            "member": member,
            "token": token,
            "lease": self.lease,
            "limit": limit,
        }
        # One round trip (the transaction's BEGIN travels with them), but two statements: the
        # read takes its snapshot after the locks were granted, so it sees what a previous
        # holder of a lane committed just before.
        wired = self.wired
        commands = [
            wire.Command(wired["lock_lanes"], params),
            wire.Command(wired["read_batch"], params, binary=True),
        ]
        if self.local is not None:
            commands.insert(0, wire.Command(wired["set_local"], self.local))
        try:
            results = await wire.run(conn, commands, begin=True, prepare=self.prepare_batches)
            first = 0 if self.local is None else 1
            tokens: dict[int, str] = dict(results.rows(first))
            if not tokens:
                return tokens, _NO_ROWS
            rows = results.rows(first + 1)
        except DRIVER_ERRORS as exc:
            raise store_error(self.store, "lock and read lanes", exc) from exc
        if len(tokens) < len(lanes):
            # A lane this member holds but whose lock another of its batches has: not ours now.
            rows = [row for row in rows if row[0] in tokens]
        return tokens, LaneRows.from_rows(rows)

    async def end_unchanged(self, conn: Connection) -> None:
        """End a batch transaction that sent nothing: it commits, keeping the lease renewals of
        the lanes it locked (they are this member's lanes; nothing else was written).

        Not a rollback: psycopg forgets every prepared statement of a connection when a
        transaction rolls back (and deallocates them on the server), so scans that find nothing
        would make the busy lanes' statements be parsed and planned again.
        """
        try:
            await conn.commit()
        except DRIVER_ERRORS as exc:
            raise store_error(self.store, "commit", exc) from exc

    async def abandon(self, conn: Connection) -> None:
        """Roll back after trouble; a connection in doubt is closed (the pool replaces it)."""
        await abandon(conn)

    async def record_outcomes(
        self,
        conn: Connection,
        *,
        member: str,
        tokens: Mapping[int, str],
        acked: Sequence[str],
        acked_lanes: Sequence[int],
        failures: Sequence[RowFailure],
    ) -> Outcomes:
        """Delete acknowledged rows (ids as UUID text, with their lanes), park failed keys and
        commit, in one round trip (partitioned storage: advance each lane's progress instead,
        copying the rows it passes unfinished into the held table, relayer/sql/partitioned.sql).

        Fenced by the lease token (UUID text) of every lane in ``tokens``: if a lease did not
        hold or a row was not there to delete, the statement raises FencedWriteError and
        nothing commits (the caller rolls back).
        """
        lanes = sorted(tokens)
        params = {
            "lanes": wire.text_list(lanes),
            "lane_count": len(lanes),
            "tokens": ",".join([tokens[lane] for lane in lanes]),
            "member": member,
            "acked_lanes": wire.text_list(acked_lanes),
            "acked": ",".join(acked),
            "failures": json.dumps(
                [
                    {
                        "lane": failure.lane,
                        "id": failure.id,
                        "error": failure.error,
                        "permanent": failure.permanent,
                    }
                    for failure in failures
                ]
            )
            if failures
            else "[]",
            "max_attempts": self.store.max_attempts,
            "backoff": self.store.retry_backoff,
            "backoff_max": self.store.retry_backoff_max,
            "expected": len(acked),
        }
        commands = [wire.Command(self.wired["record_outcomes"], params)]
        if "advance" in self.wired:  # partitioned storage: progress first, then the outcomes
            commands.insert(0, wire.Command(self.wired["advance"], params))
        try:
            results = await wire.run(conn, commands, commit=True, prepare=self.prepare_batches)
            [row] = results.rows(len(commands) - 1)
        except DRIVER_ERRORS as exc:
            lost = _fence_lost(exc)
            if lost is not None:
                raise FencedWriteError(lost) from exc
            raise store_error(self.store, "record outcomes", exc) from exc
        deleted, failed, gave_up, unparked, _ = row
        return Outcomes(int(deleted), int(failed), tuple(gave_up), int(unparked))


@dataclass(frozen=True, slots=True)
class Beat:
    """One member's heartbeat in one store, sent with the heartbeats of other stores of the
    same database (``heartbeats``)."""

    store: RelayStore
    member: str
    token: UUID


async def heartbeats(
    conn: Connection, beats: Sequence[Beat], *, prepare: bool = False
) -> list[tuple[list[str], int]]:
    """Several stores' heartbeats (``RelayStore.heartbeat``) in one round trip, on an
    autocommit connection to their database: what each returns, in order. They run in one
    pipeline, so in one implicit transaction: if one fails, none is kept (StoreError naming the
    first store; send them one by one then)."""
    try:
        async with conn.pipeline():
            cursors = [
                await conn.execute(
                    beat.store.queries["heartbeat"],
                    {"member": beat.member, "token": beat.token, "lease": beat.store.lease},
                    prepare=True if prepare else None,
                )
                for beat in beats
            ]
        return [_beat(await cursor.fetchall()) for cursor in cursors]
    except DRIVER_ERRORS as exc:
        doing = f"the heartbeats of {len(beats)} stores of its database"
        raise store_error(beats[0].store.store, doing, exc) from exc


# A SELECT takes at most 1,664 columns: asked in one statement, at most this many stores.
HOLDS_ROWS_PER_STATEMENT = 1_000


async def holds_rows(
    conn: Connection, stores: Sequence[RelayStore], *, prepare: bool = False
) -> list[bool]:
    """Whether each of ``stores`` (of one database) holds a row in any lane, in one statement
    per HOLDS_ROWS_PER_STATEMENT stores, one column each. ``prepare``: keep the statement
    prepared (a set of stores asked again and again, in one order, by the idle watch; not
    behind a transaction pooler). StoreError naming the first."""
    found: list[bool] = []
    with translated(stores[0].store, f"ask {len(stores)} stores of its database for rows"):
        for start in range(0, len(stores), HOLDS_ROWS_PER_STATEMENT):
            part = stores[start : start + HOLDS_ROWS_PER_STATEMENT]
            # Each column is a rendered named query (identifiers composed, no parameter).
            statement = "SELECT " + ", ".join(store.holds_rows_query for store in part)
            cursor = await conn.execute(statement, prepare=prepare)
            row = await cursor.fetchone()
            assert row is not None
            found.extend(bool(value) for value in row)
    return found


def _beat(rows: Sequence[Sequence[Any]]) -> tuple[list[str], int]:
    return [str(row[0]) for row in rows], int(rows[0][1]) if rows else 0


def lane_bits(lanes: Collection[int]) -> bytes:
    """``lanes`` as a bit string (bit ``lane % 8`` of byte ``lane // 8``, as PostgreSQL's
    get_bit numbers a bytea's bits), as long as the highest lane needs: 8 KB for 65,536
    lanes, bound as one parameter and tested in constant time per lane."""
    if not lanes:
        return b""
    bits = bytearray((max(lanes) >> 3) + 1)
    for lane in lanes:
        bits[lane >> 3] |= 1 << (lane & 7)
    return bytes(bits)


def _heads(rows: Sequence[Sequence[Any]]) -> list[LaneHead]:
    return list(map(LaneHead._make, rows))


async def abandon(conn: Connection) -> None:
    """Roll back after trouble; a connection in doubt is closed (the pool replaces it)."""
    try:
        if conn.broken or conn.closed:
            return
        async with asyncio.timeout(2):
            await conn.rollback()
    except DRIVER_ERRORS:  # TimeoutError (the rollback's bound) is an OSError
        await hang_up(conn)


def _fence_lost(exc: Exception) -> str | None:
    """The fence's own words if ``exc`` is the outcome statement refusing to commit."""
    if not isinstance(exc, psycopg.errors.InvalidTextRepresentation):
        return None
    text = exc.diag.message_primary or ""
    start = text.find(FENCE_MARK)
    if start < 0:
        return None
    return text[start + len(FENCE_MARK) :].rstrip('"')


_NO_ROWS = LaneRows((), OutboundBatch((), (), (), (), ()), (), ())
