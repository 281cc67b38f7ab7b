"""relayer's pytest plugin (relayer.testing) as a user's test suite meets it, run by pytester."""

from __future__ import annotations

import os
from importlib.metadata import entry_points

import psycopg
import pytest

pytest_plugins = ["pytester"]

USER_SUITE = """
import psycopg
import pytest

from relayer.testing import Drained


def write(store, outbox, commit=True, **message):
    with psycopg.connect(store.require_dsn()) as conn:
        outbox.write(conn, **message)
        if not commit:
            conn.rollback()  # leaving the block would commit


def test_a_committed_row_is_sent_once_drained(relayer_store, relayer_outbox, relayer_relay,
                                              relayer_transport):
    write(relayer_store, relayer_outbox, destination="orders", key="o-1", body=b"placed")
    write(relayer_store, relayer_outbox, destination="orders", key="o-1", body=b"paid")
    relayer_transport.assert_nothing_sent()  # nothing is sent until the test drains
    assert relayer_relay.drain() == Drained(sent=2)
    assert relayer_transport.bodies("orders") == [b"placed", b"paid"]
    relayer_transport.assert_sent("orders", key="o-1", count=2)
    assert relayer_relay.drain() == Drained()  # nothing is left


def test_a_rolled_back_row_is_never_sent(relayer_store, relayer_outbox, relayer_relay,
                                         relayer_transport):
    write(relayer_store, relayer_outbox, commit=False, destination="orders", body=b"lost")
    assert relayer_relay.drain().sent == 0
    relayer_transport.assert_nothing_sent()


def test_each_test_has_a_store_of_its_own(relayer_store, relayer_relay):
    assert relayer_relay.drain() == Drained()  # the earlier tests' rows are not here


@pytest.fixture
def relayer_store_options():
    return {"transports": {"kafka": {"type": "kafka"}}, "default_transport": "kafka"}


def test_a_named_transport_is_recorded_too(relayer_store, relayer_outbox, relayer_relay,
                                           relayer_transport):
    write(relayer_store, relayer_outbox, destination="events", body=b"unordered")
    write(relayer_store, relayer_outbox, destination="events", key="k", body=b"ordered",
          transport="kafka")
    assert relayer_relay.drain().sent == 2
    assert sorted(relayer_transport.bodies("events")) == [b"ordered", b"unordered"]


@pytest.mark.asyncio
async def test_async_tests_await_the_drain(relayer_store, relayer_outbox, relayer_relay,
                                           relayer_transport):
    async with await psycopg.AsyncConnection.connect(relayer_store.require_dsn()) as conn:
        await relayer_outbox.write_async(conn, destination="orders", key="k", body=b"async")
        await conn.commit()
    assert (await relayer_relay.drain_async()).sent == 1
    assert relayer_relay.drain() == Drained()  # the sync face works under a running loop
    relayer_transport.assert_sent(body=b"async", count=1)


def test_a_failed_assertion_says_what_was_sent(relayer_store, relayer_outbox, relayer_relay,
                                               relayer_transport):
    write(relayer_store, relayer_outbox, destination="orders", key="o-9", body=b"x")
    relayer_relay.drain()
    relayer_transport.assert_sent("orders", key="o-1")
"""


@pytest.fixture
def user_env(monkeypatch: pytest.MonkeyPatch, pg_server: str) -> str:
    monkeypatch.setenv("RELAYER_TEST_DSN", pg_server)
    return pg_server


def test_the_plugin_is_registered_for_pytest_to_load() -> None:
    [plugin] = [ep for ep in entry_points(group="pytest11") if ep.value == "relayer.testing"]
    assert plugin.name == "relayer.testing"  # so pytest_plugins = ["relayer.testing"] is no twin


def test_a_users_suite_gets_a_store_a_recording_transport_and_a_drain(
    pytester: pytest.Pytester, user_env: str
) -> None:
    pytester.makepyfile(test_orders=USER_SUITE)
    result = pytester.runpytest("-o", "asyncio_default_fixture_loop_scope=function")
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*AssertionError: expected at least one message to 'orders' with key 'o-1', found 0;"
            " sent: 'orders' key='o-9' body=b'x'"
        ]
    )
    with psycopg.connect(user_env) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname LIKE %s",
            (f"relayer_test_{os.getpid()}_%",),
        ).fetchone()
    assert left == (0,)  # every test's schema was dropped


def test_listed_in_pytest_plugins_without_autoloading(
    pytester: pytest.Pytester, user_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest('pytest_plugins = ["relayer.testing"]')
    pytester.makepyfile(
        test_one="""
        def test_drain(relayer_store, relayer_outbox, relayer_relay, relayer_transport):
            import psycopg
            with psycopg.connect(relayer_store.require_dsn()) as conn:
                relayer_outbox.write(conn, destination="d", key="k", body=b"b")
                conn.commit()
            assert relayer_relay.drain().sent == 1
            relayer_transport.assert_sent("d", count=1)
        """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


@pytest.mark.slow
def test_without_a_configured_dsn_an_embedded_postgresql_serves_the_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELAYER_TEST_DSN", raising=False)
    pytester.makepyfile(
        test_embedded="""
        def test_embedded(relayer_dsn, relayer_store):
            assert "127.0.0.1" in relayer_dsn
            assert relayer_store.db_schema.startswith("relayer_test_")
        """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)
