"""relayer.store.wire on real PostgreSQL: a batch of statements, its prepared statements, its
errors, and a connection it leaves in doubt, the same on both paths (libpq's pipeline in one
round trip, psycopg's cursors); the path a psycopg release takes, and the warning of the public
path."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import pq

from relayer.store import wire

ECHO = wire.Statement(
    "echo",
    "SELECT %(number)s::int4 AS number, %(id)s::uuid AS id, %(body)s::bytea AS body, "
    "%(number)s::int4 * 2 AS twice, '100%%' AS percent",
)
FAIL = wire.Statement("fail", "SELECT 1 / %(zero)s::int4")
SLEEP = wire.Statement("sleep", "SELECT pg_catalog.pg_sleep(%(seconds)s::float8)")
LENGTH = wire.Statement("length", "SELECT pg_catalog.length(%(text)s::text)")


@pytest.fixture
async def conn(
    pg_dsn: str, wire_path: wire.WirePath
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection, and the test runs on each path."""
    connection = await psycopg.AsyncConnection.connect(pg_dsn)
    try:
        yield connection
    finally:
        await connection.close()


async def prepared_statements(conn: psycopg.AsyncConnection[Any]) -> int:
    cursor = await conn.execute("SELECT count(*) FROM pg_catalog.pg_prepared_statements")
    row = await cursor.fetchone()
    assert row is not None
    await conn.rollback()
    return int(row[0])


def status(conn: psycopg.AsyncConnection[Any]) -> pq.TransactionStatus:
    return conn.info.transaction_status


def test_statements_number_their_placeholders_once_each() -> None:
    assert ECHO.parameters == ("number", "id", "body")
    assert ECHO.text == (
        b"SELECT $1::int4 AS number, $2::uuid AS id, $3::bytea AS body, "
        b"$1::int4 * 2 AS twice, '100%' AS percent"
    )
    assert ECHO.prepared_name((23, 2950, 17)) == ECHO.prepared_name((23, 2950, 17))
    assert ECHO.prepared_name((23, 2950, 17)) != ECHO.prepared_name((21, 2950, 17))
    assert ECHO.prepared_name((23,)) != FAIL.prepared_name((23,))


@pytest.mark.parametrize("prepare", [True, False])
@pytest.mark.parametrize("binary", [True, False])
async def test_a_transaction_in_one_round_trip_returns_each_commands_rows(
    conn: psycopg.AsyncConnection[Any], prepare: bool, binary: bool
) -> None:
    message_id = uuid.uuid4()
    params = {"number": 7, "id": message_id, "body": b"\x00\xff"}
    for _ in range(2):  # prepared the first time, executed by name the second
        results = await wire.run(
            conn,
            [wire.Command(ECHO, params, binary=binary), wire.Command(LENGTH, {"text": "four"})],
            begin=True,
            commit=True,
            prepare=prepare,
        )
        assert results.rows(0) == [(7, message_id, b"\x00\xff", 14, "100%")]
        assert results.rows(1) == [(4,)]
        assert status(conn) == pq.TransactionStatus.IDLE
    assert await prepared_statements(conn) == (2 if prepare else 0)


async def test_begin_joins_a_transaction_already_open(conn: psycopg.AsyncConnection[Any]) -> None:
    await wire.run(conn, [wire.Command(LENGTH, {"text": "a"})], begin=True)
    assert status(conn) == pq.TransactionStatus.INTRANS
    results = await wire.run(conn, [wire.Command(LENGTH, {"text": "ab"})], commit=True)
    assert results.rows(0) == [(2,)]
    assert status(conn) == pq.TransactionStatus.IDLE


async def test_a_failing_command_raises_psycopgs_error_and_leaves_the_transaction_in_error(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    for _ in range(2):  # its statement stays prepared: the second time it is not prepared again
        with pytest.raises(psycopg.errors.DivisionByZero):
            await wire.run(
                conn,
                [wire.Command(FAIL, {"zero": 0}), wire.Command(LENGTH, {"text": "x"})],
                begin=True,
                commit=True,
            )
        assert status(conn) == pq.TransactionStatus.INERROR
        await conn.rollback()
    results = await wire.run(conn, [wire.Command(FAIL, {"zero": 1})], begin=True, commit=True)
    assert results.rows(0) == [(1,)]


async def test_statements_deallocated_by_the_server_are_prepared_again(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    """psycopg sends DEALLOCATE ALL after a rollback when it prepared statements itself."""
    await wire.run(conn, [wire.Command(LENGTH, {"text": "abc"})], begin=True, commit=True)
    assert await prepared_statements(conn) == 1
    await conn.execute("DEALLOCATE ALL")
    await conn.commit()
    assert await prepared_statements(conn) == 0
    results = await wire.run(
        conn, [wire.Command(LENGTH, {"text": "abcd"})], begin=True, commit=True
    )
    assert results.rows(0) == [(4,)]
    assert await prepared_statements(conn) == 1


async def test_a_cancelled_wait_closes_the_connection(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await wire.run(conn, [wire.Command(SLEEP, {"seconds": 5})], begin=True)
    assert conn.closed


async def test_parameters_larger_than_the_socket_buffer_are_sent_whole(
    conn: psycopg.AsyncConnection[Any],
) -> None:
    text = "x" * (8 << 20)
    results = await wire.run(conn, [wire.Command(LENGTH, {"text": text})], begin=True, commit=True)
    assert results.rows(0) == [(len(text),)]


async def test_a_lost_connection_raises_an_operational_error(
    conn: psycopg.AsyncConnection[Any], pg_dsn: str
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
    with pytest.raises(psycopg.OperationalError):
        await wire.run(conn, [wire.Command(LENGTH, {"text": "a"})], begin=True)


async def prepared_names(conn: psycopg.AsyncConnection[Any]) -> list[str]:
    cursor = await conn.execute("SELECT name FROM pg_catalog.pg_prepared_statements ORDER BY 1")
    names = [str(row[0]) for row in await cursor.fetchall()]
    await conn.rollback()
    return names


@pytest.mark.parametrize(("version", "fast"), [("3.3.9", True), ("3.9.0", False)])
async def test_the_installed_psycopg_chooses_the_path_and_the_public_one_is_said_once(
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    version: str,
    fast: bool,
) -> None:
    """A tested psycopg takes libpq's pipeline, which prepares statements under relayer's
    names; another takes psycopg's cursors (psycopg prepares them under its own), with one
    warning for the process that names the version and the psycopg to install."""
    monkeypatch.setattr(wire, "installed_psycopg", lambda: version)
    monkeypatch.setattr(wire, "PROCESS_PATH", wire.WirePath.for_this_process(environ={}))
    caplog.set_level(logging.WARNING, logger="relayer.store.wire")
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        for text in ("a", "ab"):
            results = await wire.run(
                conn, [wire.Command(LENGTH, {"text": text})], begin=True, commit=True
            )
            assert results.rows(0) == [(len(text),)]
        [name] = await prepared_names(conn)
    assert name.startswith("relayer_") is fast
    warnings = [record.getMessage() for record in caplog.records]
    if fast:
        assert warnings == []
    else:
        [warning] = warnings
        assert "psycopg 3.9.0 is not one the fast path was tested with" in warning
        assert "pip install 'psycopg[binary,pool]>=" in warning
