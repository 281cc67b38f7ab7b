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
    """One ordered outbox row read under the lane lock: the message, as a transport gets it,
    the transport it names (None: the store's default) and whether it is future-dated."""

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
    gave_up: int
    unparked: int
    fence_held: bool


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
        lane: int,
        member: str,
        token: UUID,
        limit: int,
    ) -> tuple[UUID | None, list[PendingRow]]:
        """Take the lane lease (row-locked until the transaction ends) and read its head rows.

        Both statements go in one round trip; the read only returns rows if the lock took.
        Must run inside a transaction on ``conn``.
        """
        params = {"lane": lane, "member": member, "token": token, "lease": self.lease}
        async with conn.pipeline():
            locked = await conn.execute(self.queries["lock_lane"], params)
            read = await conn.execute(
                self.queries["read_batch"], {**params, "limit": limit}, binary=True
            )
        row = await locked.fetchone()
        if row is None:
            return None, []
        return row[0], [_pending(values) for values in await read.fetchall()]

    async def prepare_connection(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Create the fence check ``record_outcomes`` calls (once per connection)."""
        await conn.execute(self.queries["fence_check_function"])
        await conn.commit()

    async def record_outcomes(
        self,
        conn: psycopg.AsyncConnection[Any],
        *,
        lane: int,
        member: str,
        token: UUID,
        acked: Sequence[UUID],
        failures: Sequence[Failure],
    ) -> Outcomes:
        """Delete acknowledged rows, park failed keys and commit, in one round trip.

        Fenced by the lease token: if the lease did not hold or a row was not there to delete,
        the statement raises FencedWriteError and nothing commits (the caller rolls back).
        """
        params = {
            "lane": lane,
            "member": member,
            "token": token,
            "acked": list(acked),
            "failed": [failure.id for failure in failures],
            "errors": [failure.error for failure in failures],
            "permanent": [failure.permanent for failure in failures],
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
        return Outcomes(int(deleted), int(failed), int(gave_up), int(unparked), True)


_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


def _pending(values: Sequence[Any]) -> PendingRow:
    message_id, key, transport, destination, body, headers, future = values
    message = OutgoingMessage(
        message_id,
        destination,
        body,
        key,
        _NO_HEADERS if headers == "{}" else json.loads(headers),
    )
    return PendingRow(message, transport, future)
