"""The inbox's statement (relayer.inbox): a consumer's claim of a message id, run in the
consumer's own transaction on the caller's connection (sync or async).

The statement is ``inbox_claim`` of relayer/sql/inbox.sql. A store whose inbox table does not
exist raises SchemaNotAppliedError, saying what to run; any other driver error reaches the
caller as the driver raised it, like the caller's own statements in the same transaction.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg

from relayer.errors import SchemaNotAppliedError
from relayer.pooler import caller_prepare
from relayer.settings import StoreSettings
from relayer.sql import queries_for

# The claim's row: whether the id was claimed now (False: a duplicate), and the key's last
# claimed sequence number before it (None without one).
ClaimRow = tuple[bool, int | None]


class InboxStatements:
    """The claim statement of one store's inbox (``<prefix>inbox``)."""

    def __init__(self, store: StoreSettings) -> None:
        self.store = store
        self._claim = queries_for(store.names)["inbox_claim"]
        self._prepare = caller_prepare(store.pooler)

    def claim(self, connection: psycopg.Connection[Any], params: Mapping[str, Any]) -> ClaimRow:
        """Claim in ``connection``'s transaction (``params``: message_id, consumer, key and
        sequence)."""
        with self._applied():
            row = connection.execute(self._claim, params, prepare=self._prepare).fetchone()
        return _claimed(row)

    async def claim_async(
        self, connection: psycopg.AsyncConnection[Any], params: Mapping[str, Any]
    ) -> ClaimRow:
        with self._applied():
            cursor = await connection.execute(self._claim, params, prepare=self._prepare)
            row = await cursor.fetchone()
        return _claimed(row)

    @contextmanager
    def _applied(self) -> Iterator[None]:
        """A missing inbox table as SchemaNotAppliedError, naming the store and what to run."""
        try:
            yield
        except psycopg.errors.UndefinedTable as exc:
            raise SchemaNotAppliedError(
                f"store {self.store.name!r}: no inbox table in schema {self.store.db_schema!r} "
                f"with prefix {self.store.table_prefix!r}; run `relayer schema apply "
                f"{self.store.name}` against the consumer's database"
            ) from exc


def _claimed(row: tuple[Any, ...] | None) -> ClaimRow:
    assert row is not None  # the statement returns one row
    return bool(row[0]), None if row[1] is None else int(row[1])
