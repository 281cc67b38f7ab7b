"""A batch's statements in one libpq pipeline: the fast path of relayer.store.wire.

psycopg runs each statement through a cursor, a parsed query, a generator and a wait that is
set up and torn down per step; in pipeline mode it also flushes the socket and polls it after
every statement. Here a batch's statements go out in one write and come back in one wait on
libpq's connection (``conn.pgconn``), with psycopg's own adapters dumping the parameters and
loading the rows (``psycopg.adapt.Transformer``): the same types, bound the same way, for
about a quarter of the client CPU (a transaction of two round trips, SELECTs only, on an idle
two-core machine: 190-220 µs against psycopg's 740-790).

That leans on psycopg below its cursors (the Transformer's ``dump_sequence``, ``types``,
``formats`` and ``load_rows``; libpq's pipeline calls on ``pgconn``), read and tested for the
psycopg releases in ``TESTED_PSYCOPG``. With any other psycopg, or a libpq without pipeline
mode, ``fast_path_problem`` says why, and relayer.store.wire takes psycopg's cursors instead.

The connection must be idle (no statement of psycopg's running, not in pipeline mode), as a
batch connection from the pool is; errors are psycopg's (``psycopg.errors.error_from_result``),
so callers translate them as before. A connection left in doubt (the wait was cancelled, the
socket failed) is closed: the pool replaces it.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, LiteralString

import psycopg
from psycopg import abc, pq
from psycopg.adapt import PyFormat, Transformer

from relayer.store.driver import Connection

# psycopg releases (major.minor) whose adapters and libpq wrapper this module was written
# against and tested with (pyproject.toml pins the same range); any other takes psycopg's
# cursors. Add a release here only after tests/integration/test_wire.py and the relay contract
# suite passed on it.
TESTED_PSYCOPG = ("3.2", "3.3")

_PLACEHOLDER = re.compile(r"%\((?P<name>[a-z_][a-z0-9_]*)\)s|%%")
_BEGIN, _PREPARE, _COMMAND, _COMMIT = range(4)  # what each result of a pipeline answers


def installed_psycopg() -> str:
    return psycopg.__version__


def tested_requirement() -> str:
    """The requirement that installs a tested psycopg (what pyproject.toml asks for)."""
    first, last = TESTED_PSYCOPG[0], TESTED_PSYCOPG[-1]
    major, minor = last.split(".")
    return f"psycopg[binary,pool]>={first},<{major}.{int(minor) + 1}"


def fast_path_problem(version: str) -> str | None:
    """None if the fast path can run with psycopg ``version`` (and this libpq), else why not
    and what to do, in words."""
    if not any(version == tested or version.startswith(tested + ".") for tested in TESTED_PSYCOPG):
        releases = ", ".join(f"{tested}.x" for tested in TESTED_PSYCOPG)
        return (
            f"psycopg {version} is not one the fast path was tested with ({releases}); "
            f"install a tested psycopg (pip install '{tested_requirement()}')"
        )
    if not psycopg.Pipeline.is_supported():
        return (
            f"libpq {pq.version()} has no pipeline mode (libpq 14 or later has it); install "
            "psycopg[binary], which brings its own libpq, or a newer libpq"
        )
    return None


class Statement:
    """A named query (``%(name)s`` placeholders) and the same query as the wire takes it:
    ``$n`` placeholders, the order of its parameters, and the name it is prepared under."""

    __slots__ = ("_prepared_as", "name", "parameters", "query", "text")

    def __init__(self, name: str, query: LiteralString) -> None:
        parameters: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match[0] == "%%":
                return "%"
            if match["name"] not in parameters:
                parameters.append(match["name"])
            return f"${parameters.index(match['name']) + 1}"

        self.query = query
        self.text = _PLACEHOLDER.sub(number, query).encode()
        self.parameters = tuple(parameters)
        self.name = name
        self._prepared_as: dict[tuple[int, ...], bytes] = {}

    def prepared_name(self, types: tuple[int, ...]) -> bytes:
        """The server-side name of this statement with parameters of these types: short, and
        the same only for the same text and types (statements of several stores may share a
        connection), so that nothing process-wide has to count names."""
        name = self._prepared_as.get(types)
        if name is None:
            digest = hashlib.blake2b(self.text, digest_size=8)
            digest.update(repr(types).encode())
            name = self._prepared_as[types] = f"relayer_{digest.hexdigest()}".encode()
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


class PipelineResults:
    """The rows of each command of a pipeline (in order), loaded by psycopg's adapters when
    asked for."""

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


async def run_pipeline(
    conn: Connection,
    commands: Sequence[Command],
    *,
    begin: bool,
    commit: bool,
    prepared: set[bytes] | None,
) -> PipelineResults:
    """Run ``commands`` in one round trip on ``conn``, after a BEGIN if ``begin``, followed by
    a COMMIT if ``commit``. ``prepared``: the names of the statements prepared on ``conn``
    (those prepared now are added), None to prepare none. Raises the first failing command's
    error (psycopg's)."""
    pgconn = conn.pgconn
    transformer: abc.Transformer = Transformer(conn)
    pgconn.enter_pipeline_mode()
    try:
        sent, added = _send(
            pgconn, transformer, commands, begin=begin, commit=commit, prepared=prepared
        )
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
            if result.status == pq.ExecStatus.COMMAND_OK and prepared is not None:
                prepared.add(name)
    for result in received:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    kept = [result for result, kind in zip(received, sent, strict=True) if kind == _COMMAND]
    return PipelineResults(transformer, kept)


def _send(
    pgconn: pq.abc.PGconn,
    transformer: abc.Transformer,
    commands: Sequence[Command],
    *,
    begin: bool,
    commit: bool,
    prepared: set[bytes] | None,
) -> tuple[list[int], list[bytes]]:
    """Queue the pipeline's statements (a prepare first for each one not prepared yet): what
    each result to come answers, in order, and the names of the statements being prepared."""
    sent: list[int] = []
    added: list[bytes] = []
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
        if prepared is not None:
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
    return sent, added


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
