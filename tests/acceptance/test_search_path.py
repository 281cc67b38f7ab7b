"""A search_path that puts another schema ahead of pg_catalog cannot hijack relayer.

The database's search_path is ``evil, pg_catalog, public`` and schema ``evil`` holds functions
named like PostgreSQL's own (``now()``, ``pg_notify(text, text)``,
``pg_advisory_xact_lock(bigint)``) that record each call. Applying the schema, writing rows in
an application's transaction, ``relayer status``, ``relayer queue pause``, ``relayer schema
check`` and a worker relaying the rows (``relayer run``) never call one of them, and the
worker starts without reporting drift.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from relayer import Outbox, OutboxMessage
from relayer.settings import StoreSettings
from tests.acceptance.cli import command, environment, relayer
from tests.conftest import make_store
from tests.integration.relay.helpers import pending

HIJACK = """
CREATE SCHEMA evil;
CREATE TABLE evil.calls (name text NOT NULL);
GRANT USAGE ON SCHEMA evil TO PUBLIC;
GRANT INSERT ON evil.calls TO PUBLIC;
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
    INSERT INTO evil.calls VALUES ('now');
    SELECT pg_catalog.now();
$$;
CREATE FUNCTION evil.pg_notify(text, text) RETURNS void LANGUAGE sql VOLATILE AS $$
    INSERT INTO evil.calls VALUES ('pg_notify');
    SELECT pg_catalog.pg_notify($1, $2);
$$;
CREATE FUNCTION evil.pg_advisory_xact_lock(bigint) RETURNS void LANGUAGE sql VOLATILE AS $$
    INSERT INTO evil.calls VALUES ('pg_advisory_xact_lock');
    SELECT pg_catalog.pg_advisory_xact_lock($1);
$$;
"""


def calls(store: StoreSettings) -> list[str]:
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        return [row[0] for row in conn.execute("SELECT name FROM evil.calls").fetchall()]


@pytest.fixture
def hijacked(pg_dsn: str) -> Iterator[StoreSettings]:
    """A store in a database whose search_path resolves now() and friends to schema evil."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(HIJACK)
        database = conn.info.dbname
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET search_path = evil, pg_catalog, public").format(
                sql.Identifier(database)
            )
        )
    store = make_store(
        pg_dsn,
        lanes=8,
        lease_duration="3s",
        poll_interval="0.1s",
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # the trap works
        assert conn.execute("SHOW search_path").fetchone() == ("evil, pg_catalog, public",)
        conn.execute("SELECT now()")
    assert calls(store) == ["now"]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM evil.calls")
    yield store


def worker_env(store: StoreSettings) -> dict[str, str]:
    return environment(
        store,
        RELAYER_STORES__ORDERS__LEASE_DURATION="3s",
        RELAYER_STORES__ORDERS__POLL_INTERVAL="0.1s",
        RELAYER_STORES__ORDERS__TRANSPORTS__MEMORY__TYPE="memory",
        RELAYER_STORES__ORDERS__DEFAULT_TRANSPORT="memory",
    )


def test_no_shadowing_function_is_ever_called(hijacked: StoreSettings) -> None:
    env = worker_env(hijacked)
    applied = relayer("schema", "apply", "orders", env=env)
    assert applied.returncode == 0, applied.stderr
    assert calls(hijacked) == []

    outbox = Outbox(hijacked.model_copy(update={"sequence_numbers": True}))
    with psycopg.connect(hijacked.require_dsn()) as conn:  # the application's transaction
        outbox.write(conn, destination="events", body=b"1", key="customer-1")
        outbox.write_many(
            conn,
            [OutboxMessage("events", b"2", key=f"customer-{n}") for n in range(2, 40)],
        )
        outbox.write(conn, destination="events", body=b"3")
    assert calls(hijacked) == []

    for arguments in (
        ("schema", "check", "orders"),
        ("status", "orders"),
        ("status", "--json", "orders"),
        ("queue", "pause", "orders"),
        ("queue", "resume", "orders"),
        ("queue", "limit", "orders", "3"),
        ("queue", "status", "orders"),
        ("parked", "list", "orders"),
    ):
        result = relayer(*arguments, env=env)
        assert result.returncode == 0, (arguments, result.stdout, result.stderr)
    assert calls(hijacked) == []

    process = subprocess.Popen(command("run", "orders"), env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline_polls = 300
        while pending(hijacked) and deadline_polls and process.poll() is None:
            deadline_polls -= 1
            subprocess.run(["sleep", "0.1"], check=True)
        assert pending(hijacked) == 0
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "differ from schema version" not in stderr
    assert calls(hijacked) == []
