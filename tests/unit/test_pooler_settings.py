"""The settings of a store behind a connection pooler: pooler, listen_dsn, admin_dsn."""

from __future__ import annotations

from datetime import timedelta

import pytest

from relayer.errors import ConfigurationError
from relayer.pooler import caller_prepare, idle_timeout, idle_timeout_setting, same_pool
from relayer.settings import load_settings, store_settings
from relayer.store import batch_settings, can_listen, local_settings

POOLED = "host=pool.internal port=6432 dbname=shop user=app"
DIRECT = "host=db.internal port=5432 dbname=shop user=app"
SECRET = "hunter2-secret"


def error_of(**store: object) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(stores={"orders": store})
    return caught.value


def test_defaults_are_a_direct_connection() -> None:
    store = store_settings(name="orders", dsn=DIRECT)
    assert (store.pooler, store.listen_dsn, store.admin_dsn) == ("none", None, None)
    assert can_listen(store) and caller_prepare(store.pooler) is None
    assert local_settings(store, batch_settings(store)) is None  # start-up options instead


def test_a_transaction_pooler_listens_only_on_listen_dsn() -> None:
    store = store_settings(name="orders", dsn=POOLED, pooler="transaction")
    assert not can_listen(store) and caller_prepare(store.pooler) is False
    assert local_settings(store, {"synchronous_commit": "off"}) == {
        "names": ["synchronous_commit"],
        "values": ["off"],
    }
    assert can_listen(store_settings(dsn=POOLED, pooler="transaction", listen_dsn=DIRECT))


@pytest.mark.parametrize("value", ["session", "Transaction", "statement", "", 1, True])
def test_pooler_is_none_or_transaction(value: object) -> None:
    error = error_of(pooler=value)
    assert error.field == "stores.orders.pooler" and error.value == value
    assert error.rule.startswith("must be 'none' (a direct connection, or a pooler in session")


def test_options_are_refused_behind_a_transaction_pooler() -> None:
    with_options = f"{POOLED} password={SECRET} options='-c statement_timeout=5s'"
    error = error_of(dsn=with_options, pooler="transaction")
    assert error.field == "stores.orders.dsn" and SECRET not in str(error)
    assert "refuses at connect" in error.rule and "ALTER ROLE" in error.rule
    assert store_settings(dsn=with_options).pooler == "none"  # direct: options are fine
    # Inherited from the top-level dsn: refused there.
    with pytest.raises(ConfigurationError) as caught:
        load_settings(dsn=with_options, stores={"orders": {"pooler": "transaction"}})
    assert caught.value.field == "dsn" and SECRET not in str(caught.value)


def test_listen_dsn_must_not_reach_the_transaction_pool() -> None:
    error = error_of(dsn=POOLED, pooler="transaction", listen_dsn=f"{POOLED} password={SECRET}")
    assert error.field == "stores.orders.listen_dsn" and SECRET not in str(error)
    assert "LISTEN never fires" in error.rule
    # A session-mode alias (another database name) or another user is another pool.
    assert not same_pool(POOLED, POOLED.replace("dbname=shop", "dbname=shop_session"))
    assert not same_pool(POOLED, POOLED.replace("user=app", "user=listener"))
    assert same_pool("postgresql://app@pool.internal:6432/shop", POOLED)


def test_listen_and_admin_dsns_are_checked_and_never_shown() -> None:
    error = error_of(listen_dsn=f"host=db password={SECRET} dbname")
    assert error.field == "stores.orders.listen_dsn" and SECRET not in str(error)
    assert error_of(admin_dsn="host='unterminated").field == "stores.orders.admin_dsn"
    store = store_settings(
        dsn=DIRECT,
        listen_dsn=f"postgresql://app:{SECRET}@db/shop",
        admin_dsn=f"host=db password={SECRET}",
    )
    assert SECRET not in repr(store) and "listen_dsn=" in repr(store)


def test_the_idle_limit_of_a_batch_is_three_quarters_of_a_lease() -> None:
    assert idle_timeout(timedelta(seconds=30)) == timedelta(seconds=22.5)
    assert idle_timeout_setting(timedelta(seconds=30)) == "22500ms"
    store = store_settings(lease_duration="8s")
    assert batch_settings(store) == {
        "synchronous_commit": "off",
        "enable_bitmapscan": "off",
        "idle_in_transaction_session_timeout": "6000ms",
    }
