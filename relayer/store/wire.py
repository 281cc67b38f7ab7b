"""A short path to the wire for the statements of a lane batch (relayer.store.relay) and of a
queue claim (relayer.dispatch): ``run`` takes a connection and its commands (a named statement
with its values each) and returns the rows of each command.

It goes one of two ways, with the same statements, parameters, transaction, rows and errors:
- the fast path (relayer.store.libpq_pipeline): the commands in one round trip through libpq's
  pipeline, for about a quarter of psycopg's client CPU. It drives psycopg below its cursors,
  so it runs only with the psycopg releases it was tested with (``TESTED_PSYCOPG`` there);
- the public path: psycopg's cursors, a round trip per command, with any other psycopg. The
  process says so once, at its first batch: a warning (action ``store_slow_path``) that names
  the installed psycopg and the tested ones to install instead.

``RELAYER_TEST_WIRE_PATH=public`` forces the public path (read once, when this module is first
imported): relayer's own tests and benchmarks use it to run both paths. The process's choice is
the one object ``PROCESS_PATH``; a test swaps it for a ``WirePath`` of its own.

Statements are prepared on the server once per connection (per parameter types), unless a
transaction pooler is in front (``prepare=False``). psycopg deallocates every prepared
statement of a connection after a rollback when it has prepared some itself; a batch whose
prepared statement is gone (SQLSTATE 26000) forgets the connection's and runs again once,
preparing them anew.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import psycopg
from psycopg import pq
from psycopg.rows import tuple_row

from relayer.store.driver import Connection
from relayer.store.libpq_pipeline import (
    Command,
    Statement,
    fast_path_problem,
    installed_psycopg,
    run_pipeline,
)

__all__ = [
    "FORCE_VARIABLE",
    "PROCESS_PATH",
    "Command",
    "Results",
    "Statement",
    "WirePath",
    "run",
    "text_list",
]

logger = logging.getLogger(__name__)

FORCE_VARIABLE = "RELAYER_TEST_WIRE_PATH"
_STATEMENT_GONE = "26000"  # invalid_sql_statement_name: a prepared statement was deallocated
_IDLE = pq.TransactionStatus.IDLE


class Results(Protocol):
    """The rows of each command of a ``run`` (by its index)."""

    def rows(self, index: int) -> list[tuple[Any, ...]]: ...


class FetchedRows:
    """The rows of each command as psycopg's cursors fetched them (the public path)."""

    __slots__ = ("_rows",)

    def __init__(self, rows: list[list[tuple[Any, ...]]]) -> None:
        self._rows = rows

    def rows(self, index: int) -> list[tuple[Any, ...]]:
        return self._rows[index]


class WirePath:
    """The way a process's commands go to PostgreSQL, and what the fast path keeps of each
    connection (the names of the statements it prepared there).

    ``public``: through psycopg's cursors; ``problem``: why the fast path cannot run here (it
    implies ``public`` and is said once, as a warning, at the first ``run``).
    """

    __slots__ = ("_prepared", "_warned", "problem", "public")

    def __init__(self, *, public: bool = False, problem: str | None = None) -> None:
        self.problem = problem
        self.public = public or problem is not None
        # Forgotten with the connection (a connection the pool closed and dropped).
        self._prepared: weakref.WeakKeyDictionary[Connection, set[bytes]] = (
            weakref.WeakKeyDictionary()
        )
        self._warned = False

    @classmethod
    def for_this_process(cls, environ: Mapping[str, str] = os.environ) -> WirePath:
        """The fast path if the installed psycopg is a tested one and ``environ`` does not
        force the public path."""
        forced = environ.get(FORCE_VARIABLE, "").strip().lower() == "public"
        return cls(public=forced, problem=fast_path_problem(installed_psycopg()))

    async def send(
        self,
        conn: Connection,
        commands: Sequence[Command],
        *,
        begin: bool,
        commit: bool,
        prepare: bool,
    ) -> Results:
        """``run``'s commands, once, this way (``begin``: no transaction is open; open one)."""
        if self.problem is not None and not self._warned:
            self._warned = True
            logger.warning(
                "relayer runs the statements of its batches through psycopg's cursors (slower: a "
                "round trip per statement and more CPU than its fast path): %s",
                self.problem,
                extra={"action": "store_slow_path"},
            )
        if self.public:
            return await _through_cursors(
                conn, commands, begin=begin, commit=commit, prepare=prepare
            )
        prepared = self._prepared.setdefault(conn, set()) if prepare else None
        return await run_pipeline(conn, commands, begin=begin, commit=commit, prepared=prepared)

    def forget_prepared(self, conn: Connection) -> None:
        """The server deallocated ``conn``'s prepared statements: prepare them anew."""
        self._prepared.pop(conn, None)


# The psycopg a process runs with is the process's: so is the path (tests swap it).
PROCESS_PATH = WirePath.for_this_process()


def text_list(numbers: Iterable[int]) -> str:
    """Integers as the comma-separated text a statement splits (``string_to_array``), "" for
    none: one text parameter binds far faster than an array parameter."""
    return ",".join(map(str, numbers))


async def run(
    conn: Connection,
    commands: Sequence[Command],
    *,
    begin: bool = False,
    commit: bool = False,
    prepare: bool = True,
) -> Results:
    """Run ``commands`` on ``conn``: after a BEGIN if ``begin`` (and none is open), followed by
    a COMMIT if ``commit``; the rows of each command. Raises the first failing command's error
    (psycopg's); the transaction is then in error, for the caller to roll back. ``conn`` must
    be idle (no statement of psycopg's running, not in pipeline mode), as a batch connection
    from the pool is; one left in doubt (the wait was cancelled, the socket failed) is closed:
    the pool replaces it."""
    path = PROCESS_PATH
    opens = begin and conn.info.transaction_status == _IDLE
    try:
        return await path.send(conn, commands, begin=opens, commit=commit, prepare=prepare)
    except psycopg.Error as exc:
        if not (prepare and opens and exc.sqlstate == _STATEMENT_GONE and not conn.closed):
            raise
        # psycopg deallocated every prepared statement (after a rollback): the transaction
        # this call began did nothing yet; it ends, and the statements are prepared again.
        path.forget_prepared(conn)
        await conn.rollback()
        return await path.send(conn, commands, begin=True, commit=commit, prepare=prepare)


async def _through_cursors(
    conn: Connection,
    commands: Sequence[Command],
    *,
    begin: bool,
    commit: bool,
    prepare: bool,
) -> FetchedRows:
    """The public path: each command through a psycopg cursor, in the transaction the pipeline
    would run it in. Anything but the server's answer (an error with a SQLSTATE) leaves the
    connection in doubt, as on the fast path: it is closed."""
    try:
        if begin or conn.info.transaction_status != _IDLE:
            if begin and conn.autocommit:  # else psycopg begins with the first command
                await conn.execute("BEGIN")
            rows = await _execute_each(conn, commands, prepare)
            if commit:
                await conn.commit()
        else:
            # No transaction open and none asked for: the pipeline's commands would run in one
            # implicit transaction, ended by its sync.
            async with conn.transaction():
                rows = await _execute_each(conn, commands, prepare)
    except psycopg.Error as exc:
        if exc.sqlstate is None:
            await conn.close()
        raise
    except BaseException:
        await conn.close()
        raise
    return FetchedRows(rows)


async def _execute_each(
    conn: Connection, commands: Sequence[Command], prepare: bool
) -> list[list[tuple[Any, ...]]]:
    fetched: list[list[tuple[Any, ...]]] = []
    for command in commands:
        statement = command.statement
        # Only its own parameters, as the pipeline binds them (a command's values may serve
        # several statements).
        params = {name: command.params[name] for name in statement.parameters}
        async with conn.cursor(binary=command.binary, row_factory=tuple_row) as cursor:
            await cursor.execute(statement.query, params, prepare=prepare)
            fetched.append(await cursor.fetchall() if cursor.description is not None else [])
    return fetched
