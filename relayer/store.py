"""The relay's side of the database: every statement the ordered protocol runs.

This is the only module of the relay that runs SQL. It returns frozen value objects; no
driver rows travel further. Statements live in ``relayer/sql/relay.sql``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from uuid import UUID

import psycopg

from relayer.errors import FencedWriteError
from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.transports.base import OutgoingMessage

# The SQLSTATE pg_temp.relayer_fence_check raises (relay.sql).
FENCE_LOST = "RL001"


@dataclass(frozen=True, slots=True)
class LaneHead:
    """What a probe learned about one lane, without taking any lock."""

    lane: int
    head_id: UUID | None
    future: bool
    due_in: float
    owner: str | None
    lease_live: bool
    lease_left: float


@dataclass(frozen=True, slots=True)
class PendingRow:
    """One ordered outbox row read under its lane's lock: its lane, the message as a
    transport gets it, the transport it names (None: the store's default) and whether it is
    future-dated."""

    lane: int
    message: OutgoingMessage
    transport: str | None
    future: bool

    @property
    def id(self) -> UUID:
        return self.message.id

    @property
    def key(self) -> str:
        return self.message.key or ""

    @property
    def destination(self) -> str:
        return self.message.destination


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed head row: the error to record and whether retrying can help."""

    id: UUID
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
        self.queries = queries_for(store.names)
        self.lease = store.lease_duration

    async def ensure_lane_rows(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(self.queries["ensure_lane_rows"], {"lanes": self.store.lanes})

    async def heartbeat(
        self, conn: psycopg.AsyncConnection[Any], member: str, token: UUID
    ) -> list[str]:
        """Renew ``member``, drop expired members; the live members in rank order."""
        cursor = await conn.execute(
            self.queries["heartbeat"], {"member": member, "token": token, "lease": self.lease}
        )
        return [str(row[0]) for row in await cursor.fetchall()]

    async def release_lanes(
        self, conn: psycopg.AsyncConnection[Any], member: str, keep: Sequence[int]
    ) -> int:
        cursor = await conn.execute(
            self.queries["release_lanes"], {"member": member, "keep": list(keep)}
        )
        return cursor.rowcount

    async def leave(self, conn: psycopg.AsyncConnection[Any], member: str) -> None:
        await conn.execute(self.queries["leave"], {"member": member})

    async def probe(
        self, conn: psycopg.AsyncConnection[Any], lanes: Sequence[int], *, busy_only: bool = False
    ) -> list[LaneHead]:
        """Each lane's head; with ``busy_only``, only lanes that hold a row are returned (found
        with a loose index scan: the cost follows busy lanes, not lanes)."""
        query = self.queries["probe_share" if busy_only else "probe"]
        cursor = await conn.execute(query, {"lanes": list(lanes)})
        return [
            LaneHead(
                lane=int(lane),
                head_id=head_id,
                future=bool(future),
                due_in=float(due_in or 0.0),
                owner=owner or None,
                lease_live=bool(lease_live),
                lease_left=float(lease_left or 0.0),
            )
            for lane, head_id, _deliver_at, future, due_in, owner, lease_live, lease_left in (
                await cursor.fetchall()
            )
        ]

    async def lock_and_read(
        self,
        conn: psycopg.AsyncConnection[Any],
        lanes: Sequence[int],
        member: str,
        token: UUID,
        limit: int,
    ) -> tuple[dict[int, UUID], list[PendingRow]]:
        """Take the leases of ``lanes`` (row-locked until the transaction ends) and read at
        most ``limit`` head rows of each lane taken.

        Returns each lane taken with its lease token, and the rows of those lanes in
        (lane, id) order; a lane whose lease row is locked by another batch, or held by another
        live member, is left out. Must run inside a transaction on ``conn``.
        """
        params = {
            "lanes": list(lanes),
            "member": member,
            "token": token,
            "lease": self.lease,
            "limit": limit,
        }
        # One round trip (the transaction's BEGIN travels with them), but two statements: the
        # read takes its snapshot after the locks were granted, so it sees what a previous
        # holder of a lane committed just before.
        async with conn.pipeline():
            await conn.execute(self.queries["batch_settings"])
            locked = await conn.execute(self.queries["lock_lanes"], params)
            read = await conn.execute(self.queries["read_batch"], params, binary=True)
        tokens = {int(lane): lane_token for lane, lane_token in await locked.fetchall()}
        if not tokens:
            return tokens, []
        return tokens, [
            _pending(values[0], values[1:])
            for values in await read.fetchall()
            if values[0] in tokens
        ]

    async def end_unchanged(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """End a batch transaction that sent nothing: it commits, keeping the lease renewals of
        the lanes it locked (they are this member's lanes; nothing else was written).

        Not a rollback: psycopg forgets every prepared statement of a connection when a
        transaction rolls back (and deallocates them on the server), so scans that find nothing
        would make the busy lanes' statements be parsed and planned again.
        """
        await conn.commit()

    async def prepare_connection(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Create the fence check ``record_outcomes`` calls (once per connection)."""
        await conn.execute(self.queries["fence_check_function"])
        await conn.commit()

    async def record_outcomes(
        self,
        conn: psycopg.AsyncConnection[Any],
        *,
        member: str,
        tokens: Mapping[int, UUID],
        acked: Sequence[PendingRow],
        failures: Sequence[tuple[PendingRow, Failure]],
    ) -> Outcomes:
        """Delete acknowledged rows, park failed keys and commit, in one round trip.

        Fenced by the lease token of every lane in ``tokens``: if a lease did not hold or a row
        was not there to delete, the statement raises FencedWriteError and nothing commits (the
        caller rolls back).
        """
        lanes = sorted(tokens)
        params = {
            "lanes": lanes,
            "tokens": [tokens[lane] for lane in lanes],
            "member": member,
            "acked_lanes": [row.lane for row in acked],
            "acked": [row.id for row in acked],
            "failed_lanes": [row.lane for row, _ in failures],
            "failed": [failure.id for _, failure in failures],
            "errors": [failure.error for _, failure in failures],
            "permanent": [failure.permanent for _, failure in failures],
            "max_attempts": self.store.max_attempts,
            "backoff": self.store.retry_backoff,
            "backoff_max": self.store.retry_backoff_max,
            "expected": len(acked),
        }
        try:
            async with conn.pipeline():
                cursor = await conn.execute(self.queries["record_outcomes"], params)
                await conn.commit()
        except psycopg.Error as exc:
            if exc.sqlstate == FENCE_LOST:
                raise FencedWriteError(exc.diag.message_primary or str(exc)) from exc
            raise
        row = await cursor.fetchone()
        assert row is not None
        deleted, failed, gave_up, unparked, _ = row
        return Outcomes(int(deleted), int(failed), tuple(gave_up), int(unparked))


_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


def _pending(lane: int, values: Sequence[Any]) -> PendingRow:
    message_id, key, transport, destination, body, headers, future = values
    message = OutgoingMessage(
        message_id,
        destination,
        body,
        key,
        _NO_HEADERS if headers == "{}" else json.loads(headers),
    )
    return PendingRow(lane, message, transport, future)
