"""A short path to the wire for the statements a lane batch runs (relayer.store.relay).

psycopg runs each statement through a cursor, a parsed query, a generator and a wait that is
set up and torn down per step; in pipeline mode it also flushes the socket and polls it after
every statement. On this path a batch's statements go out in one write and come back in one
wait on libpq's connection (``conn.pgconn``), with psycopg's own adapters dumping the
parameters and loading the rows (``psycopg.adapt.Transformer``): the same types, bound the
same way, for about a quarter of the client CPU (a transaction of two round trips, SELECTs
only, on an idle two-core machine: 190-220 µs against psycopg's 740-790).

The connection must be idle (no statement of psycopg's running, not in pipeline mode), as a
batch connection from the pool is; errors are psycopg's (``psycopg.errors.error_from_result``),
so callers translate them as before. A connection left in doubt (the wait was cancelled, the
socket failed) is closed: the pool replaces it.

Statements are prepared on the server once per connection (per parameter types), unless a
transaction pooler is in front (``prepare=False``). psycopg deallocates every prepared
statement of a connection after a rollback when it has prepared some itself; a batch whose
prepared statement is gone (SQLSTATE 26000) forgets the connection's and runs again once,
preparing them anew.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import abc, pq
from psycopg.adapt import PyFormat, Transformer

from relayer.store.driver import Connection

_PLACEHOLDER = re.compile(r"%\((?P<name>[a-z_][a-z0-9_]*)\)s|%%")
_numbers = itertools.count(1)  # of the server-side names of prepared statements
_STATEMENT_GONE = "26000"  # invalid_sql_statement_name: a prepared statement was deallocated

# The prepared statements of each connection (by name); forgotten with the connection.
_prepared: weakref.WeakKeyDictionary[Connection, set[bytes]] = weakref.WeakKeyDictionary()


class Statement:
    """A named query (``%(name)s`` placeholders) as the wire takes it: ``$n`` placeholders,
    the order of its parameters, and the name it is prepared under."""

    __slots__ = ("_prepared_as", "name", "parameters", "text")

    def __init__(self, name: str, query: str) -> None:
        parameters: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match[0] == "%%":
                return "%"
            if match["name"] not in parameters:
                parameters.append(match["name"])
            return f"${parameters.index(match['name']) + 1}"

        self.text = _PLACEHOLDER.sub(number, query).encode()
        self.parameters = tuple(parameters)
        self.name = name
        self._prepared_as: dict[tuple[int, ...], bytes] = {}

    def prepared_name(self, types: tuple[int, ...]) -> bytes:
        """The server-side name of this statement with parameters of these types: short and
        unique in the process (statements of several stores may share a connection)."""
        name = self._prepared_as.get(types)
        if name is None:
            name = self._prepared_as[types] = f"relayer_{next(_numbers)}".encode()
        return name

    def __repr__(self) -> str:
        return f"Statement({self.name!r})"


class Command:
    """One statement of a pipeline with its parameter values; ``binary``: rows come back in
    binary (bytea and integers load without parsing text)."""

    __slots__ = ("binary", "params", "statement")

    def __init__(
        self, statement: Statement, params: Mapping[str, Any], *, binary: bool = False
    ) -> None:
        self.statement = statement
        self.params = params
        self.binary = binary


class Results:
    """The rows of each command of a pipeline (in order), loaded by psycopg's adapters."""

    __slots__ = ("_results", "_transformer")

    def __init__(self, transformer: abc.Transformer, results: list[pq.abc.PGresult]) -> None:
        self._transformer = transformer
        self._results = results

    def rows(self, index: int) -> list[tuple[Any, ...]]:
        result = self._results[index]
        transformer = self._transformer
        transformer.set_pgresult(result)
        rows: list[tuple[Any, ...]] = transformer.load_rows(0, result.ntuples, tuple)
        return rows


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
    """Run ``commands`` in one round trip on ``conn``: after a BEGIN if ``begin`` (and none is
    open), followed by a COMMIT if ``commit``; the rows of each command. Raises the first
    failing command's error (psycopg's); the transaction is then in error, for the caller to
    roll back."""
    opens = begin and conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
    try:
        return await _run(conn, commands, begin=opens, commit=commit, prepare=prepare)
    except psycopg.Error as exc:
        if not (prepare and opens and exc.sqlstate == _STATEMENT_GONE and not conn.closed):
            raise
        # psycopg deallocated every prepared statement (after a rollback): the transaction
        # this call began did nothing yet; it ends, and the statements are prepared again.
        _prepared.pop(conn, None)
        await conn.rollback()
        return await _run(conn, commands, begin=True, commit=commit, prepare=prepare)


_BEGIN, _PREPARE, _COMMAND, _COMMIT = range(4)


async def _run(
    conn: Connection,
    commands: Sequence[Command],
    *,
    begin: bool,
    commit: bool,
    prepare: bool,
) -> Results:
    pgconn = conn.pgconn
    transformer: abc.Transformer = Transformer(conn)
    prepared = _prepared.setdefault(conn, set()) if prepare else set()
    added: list[bytes] = []
    sent: list[int] = []  # what each result to come answers, in order
    pgconn.enter_pipeline_mode()
    try:
        if begin:
            pgconn.send_query_params(b"BEGIN", None)
            sent.append(_BEGIN)
        for command in commands:
            statement = command.statement
            params = command.params
            values = transformer.dump_sequence(
                [params[name] for name in statement.parameters],
                [PyFormat.AUTO] * len(statement.parameters),
            )
            types, formats = transformer.types or (), transformer.formats
            result_format = pq.Format.BINARY if command.binary else pq.Format.TEXT
            if prepare:
                name = statement.prepared_name(tuple(types))
                if name not in prepared:
                    pgconn.send_prepare(name, statement.text, param_types=types)
                    added.append(name)
                    sent.append(_PREPARE)
                pgconn.send_query_prepared(
                    name, values, param_formats=formats, result_format=result_format
                )
            else:
                pgconn.send_query_params(
                    statement.text,
                    values,
                    param_types=types,
                    param_formats=formats,
                    result_format=result_format,
                )
            sent.append(_COMMAND)
        if commit:
            pgconn.send_query_params(b"COMMIT", None)
            sent.append(_COMMIT)
        pgconn.pipeline_sync()
        received = await _receive(pgconn)
        pgconn.exit_pipeline_mode()
    except BaseException:
        if pgconn.pipeline_status != pq.PipelineStatus.OFF:
            # Cancelled or failed half-way: results are still to come, and psycopg cannot use
            # a connection left in pipeline mode. Closed; the pool opens another.
            pgconn.finish()
        raise
    if len(received) != len(sent):
        pgconn.finish()
        raise psycopg.InternalError(
            f"pipeline of {len(sent)} statements returned {len(received)} results; the "
            "connection was closed"
        )
    # A statement prepared is kept whatever comes after it (not undone by a rollback).
    names = iter(added)
    for result, kind in zip(received, sent, strict=True):
        if kind == _PREPARE:
            name = next(names)
            if result.status == pq.ExecStatus.COMMAND_OK:
                prepared.add(name)
    for result in received:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    kept = [result for result, kind in zip(received, sent, strict=True) if kind == _COMMAND]
    return Results(transformer, kept)


async def _receive(pgconn: pq.abc.PGconn) -> list[pq.abc.PGresult]:
    """Send what is queued and collect a result per statement, up to the pipeline's sync."""
    loop = asyncio.get_running_loop()
    socket = pgconn.socket
    waiter: asyncio.Future[None] | None = None

    def wake() -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    results: list[pq.abc.PGresult] = []
    loop.add_reader(socket, wake)
    try:
        while pgconn.flush():  # the socket is full: wait until it takes more (or replies)
            waiter = loop.create_future()
            loop.add_writer(socket, wake)
            try:
                await waiter
            finally:
                loop.remove_writer(socket)
            pgconn.consume_input()
        ended = False  # the last result read ended a statement's results
        while True:
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    if ended:
                        break  # nothing more until more arrives
                    ended = True
                    continue
                ended = False
                if result.status == pq.ExecStatus.PIPELINE_SYNC:
                    return results
                results.append(result)
            waiter = loop.create_future()
            await waiter
            pgconn.consume_input()
    finally:
        loop.remove_reader(socket)
