"""The statements of unordered sending (relayer.relay.unordered): claim, settle, end the
transaction.

Statements live in ``relayer/sql/unordered.sql``. Claimed rows come back as the messages a
transport sends; driver errors come back as StoreError.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from relayer.errors import FencedWriteError
from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.store.connections import local_settings, unordered_settings
from relayer.store.driver import Connection, translated
from relayer.transports.base import OutgoingMessage


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed row: the error to record and whether retrying can help."""

    id: UUID
    error: str
    permanent: bool = False


Claimed = tuple[OutgoingMessage, str | None]
"""A claimed row as the message a transport sends, and the transport it names (None: the
store's default)."""


class UnorderedStore:
    """The unordered statements of one store. Each claim starts a transaction on ``conn``
    (autocommit off) that ``settle`` commits or ``end`` rolls back."""

    def __init__(self, store: StoreSettings) -> None:
        self.store = store
        self.queries = queries_for(store.names)
        self.local = local_settings(store, unordered_settings(store))

    async def claim_ids(self, conn: Connection, ids: Sequence[UUID]) -> list[Claimed]:
        """The rows with these ids that exist, are due and no other sender holds, locked."""
        return await self._claim(conn, "unordered_claim_ids", {"ids": list(ids)})

    async def claim_due(self, conn: Connection, limit: int) -> list[Claimed]:
        """Up to ``limit`` rows older than the grace period or due again, locked."""
        params = {"grace": self.store.unordered_grace, "limit": limit}
        return await self._claim(conn, "unordered_claim_due", params)

    async def look(self, conn: Connection) -> tuple[bool, bool]:
        """(a row is due for recovery: ``claim_due`` would find one unless another sender holds
        it; any unordered row waits at all), in one statement on an autocommit connection,
        taking no lock."""
        with translated(self.store, "look for unordered rows"):
            # Not prepared: a look runs every few seconds at most, for each store of a fleet,
            # on the housekeeping connection, which keeps its prepared statements for what runs
            # most often (relayer.store.databases).
            cursor = await conn.execute(
                self.queries["unordered_due_exists"],
                {"grace": self.store.unordered_grace},
                prepare=False,
            )
            row = await cursor.fetchone()
        return (bool(row[0]), bool(row[1])) if row else (False, False)

    async def _claim(
        self, conn: Connection, query: str, params: Mapping[str, Any]
    ) -> list[Claimed]:
        with translated(self.store, "claim unordered rows"):
            if self.local is None:
                cursor = await conn.execute(self.queries[query], params, binary=True)
            else:
                async with conn.pipeline():  # one round trip all the same
                    await conn.execute(self.queries["set_local"], self.local)
                    cursor = await conn.execute(self.queries[query], params, binary=True)
            rows = await cursor.fetchall()
        return [_message(row) for row in rows]

    async def settle(
        self, conn: Connection, acked: Sequence[UUID], failures: Sequence[Failure]
    ) -> tuple[int, int]:
        """Delete the acknowledged rows, give each failed row an attempt and a retry time, and
        commit; (deleted, retried). FencedWriteError (nothing committed) if a claimed row was
        not there to change."""
        params = {
            "acked": list(acked),
            "failed": [failure.id for failure in failures],
            "errors": [failure.error for failure in failures],
            "permanent": [failure.permanent for failure in failures],
            "backoff": self.store.retry_backoff,
            "backoff_max": self.store.retry_backoff_max,
        }
        with translated(self.store, "settle unordered rows"):
            cursor = await conn.execute(self.queries["unordered_settle"], params)
            row = await cursor.fetchone()
            assert row is not None
            deleted, retried = int(row[0]), int(row[1])
            if deleted != len(acked) or retried != len(failures):
                # The rows are locked by this transaction: only a bug or a manual change gets
                # here.
                raise FencedWriteError(
                    f"unordered outcomes matched {deleted}/{len(acked)} deletes and "
                    f"{retried}/{len(failures)} retries"
                )
            await conn.commit()
        return deleted, retried

    async def end(self, conn: Connection) -> None:
        """End a claim that changed nothing (its row locks are released)."""
        with translated(self.store, "end an unordered claim"):
            await conn.rollback()


def _message(row: Sequence[Any]) -> Claimed:
    message_id, transport, destination, body, headers = row
    decoded: Mapping[str, str] = {} if headers == "{}" else json.loads(headers)
    return OutgoingMessage(message_id, destination, body, None, decoded), transport
