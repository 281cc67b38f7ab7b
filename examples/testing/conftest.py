"""The app's own fixture: a connection whose tables live in the test's schema.

relayer's fixtures (relayer_store, relayer_outbox, relayer_transport, relayer_relay) come from
its pytest plugin, which loads by itself once relayer is installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from shop import create_tables

from relayer.settings import StoreSettings


@pytest.fixture
def conn(relayer_store: StoreSettings) -> Iterator[psycopg.Connection[Any]]:
    # relayer_store has a schema of its own, dropped after the test: the app's tables go there
    # too, so every test starts from empty tables.
    options = f"-c search_path={relayer_store.db_schema}"
    with psycopg.connect(relayer_store.require_dsn(), options=options) as connection:
        create_tables(connection)
        yield connection
