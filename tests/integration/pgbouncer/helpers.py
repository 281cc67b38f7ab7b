"""Stores reached through a real PgBouncer in transaction mode (tests/pgbouncer.py)."""

from __future__ import annotations

from typing import Any

import pytest

from relayer.settings import StoreSettings
from tests.conftest import make_store
from tests.pgbouncer import PgBouncer

BOUNCERS = ["pgbouncer", "pgbouncer_strict"]


def bouncer_of(request: pytest.FixtureRequest) -> PgBouncer:
    """The PgBouncer a test parametrized over BOUNCERS runs through."""
    bouncer: PgBouncer = request.getfixturevalue(request.param)
    return bouncer


def pooled(store: StoreSettings, bouncer: PgBouncer, **overrides: Any) -> StoreSettings:
    """``store`` (schema applied directly) reached through ``bouncer``, pooler 'transaction'."""
    values: dict[str, Any] = {
        "table_prefix": store.table_prefix,
        "lanes": store.lanes,
        "pooler": "transaction",
    }
    values.update(overrides)
    return make_store(bouncer.dsn_for(store.require_dsn()), **values)
