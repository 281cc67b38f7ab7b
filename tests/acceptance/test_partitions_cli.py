"""``relayer partitions rotate STORE`` as an operator's cron job runs it, and what ``relayer
status`` shows of a partitioned store's partitions (docs/storage.md#rotation)."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from relayer.settings import StoreSettings
from relayer.store.partitions import PARTITIONS_AHEAD
from tests.acceptance.cli import environment, relayer
from tests.conftest import apply_schema, make_store
from tests.integration.test_partition_ops import SPAN, cut_partitions_ahead, partitioned_store


def partitioned_environment(store: StoreSettings, **extra: str) -> dict[str, str]:
    return environment(
        store,
        RELAYER_STORES__ORDERS__STORAGE="partitioned",
        RELAYER_STORES__ORDERS__PARTITION_SPAN="1m",
        **extra,
    )


def rotate_json(store: StoreSettings) -> Any:
    result = relayer("partitions", "rotate", "orders", "--json", env=partitioned_environment(store))
    assert result.returncode == 0 and not result.stderr, result.stderr
    return json.loads(result.stdout)


def partition_count(store: StoreSettings) -> int:
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'orders_outbox'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_rotate_creates_the_partitions_ahead_and_says_what_it_did(pg_dsn: str) -> None:
    store = await partitioned_store(pg_dsn)
    await cut_partitions_ahead(store, 2)
    before = partition_count(store)
    result = relayer("partitions", "rotate", "orders", env=partitioned_environment(store))
    assert result.returncode == 0 and not result.stderr, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "store 'orders':"
    created = next(line for line in lines if line.lstrip().startswith("created"))
    count = int(created.split()[1])
    assert count >= PARTITIONS_AHEAD - 3 and "orders_op_" in created
    assert partition_count(store) == before + count
    assert "skipped    no" in result.stdout
    assert "s ahead of the database clock" in lines[-1]

    again = rotate_json(store)  # nothing left to do
    assert (again["created"], again["dropped"], again["finalized"]) == ([], [], [])
    assert again["skipped"] is None and again["partitions"] == before + count
    assert again["partitions_ahead_seconds"] > PARTITIONS_AHEAD * SPAN - 30


async def test_status_shows_the_partitions_and_how_far_ahead_they_reach(pg_dsn: str) -> None:
    store = await partitioned_store(pg_dsn)
    env = partitioned_environment(store)
    text = relayer("status", "orders", env=env)
    assert text.returncode == 0, text.stderr
    assert f"orders_outbox: the sum over its {PARTITIONS_AHEAD + 2} partitions" in text.stdout
    assert "the newest partition reaches" in text.stdout
    document = json.loads(relayer("status", "orders", "--json", env=env).stdout)
    health = document["health"]
    outbox = next(table for table in health["tables"] if table["table"] == "orders_outbox")
    assert outbox["partitions"] == PARTITIONS_AHEAD + 2 and outbox["size_bytes"] > 0
    assert health["partitions_ahead_seconds"] > PARTITIONS_AHEAD * SPAN - 30

    await cut_partitions_ahead(store, 2)
    text = relayer("status", "orders", env=env)
    assert "warning: the partitions ahead of the database clock run out in" in text.stdout
    assert "`relayer partitions rotate orders`" in text.stdout


async def test_rotate_refuses_a_delete_mode_store_and_one_not_applied(pg_dsn: str) -> None:
    plain = make_store(pg_dsn)
    result = relayer("partitions", "rotate", "orders", store=plain)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "relayer: error: stores.orders.storage: 'delete' is invalid: only a partitioned store "
        "(storage = 'partitioned') has partitions to rotate"
    ]
    result = relayer("partitions", "rotate", "orders", env=partitioned_environment(plain))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "run `relayer schema apply orders` first" in result.stderr
    await apply_schema(plain)  # a delete-mode outbox, configured as partitioned
    result = relayer("partitions", "rotate", "orders", env=partitioned_environment(plain))
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "stores.orders.storage: 'partitioned' is invalid" in result.stderr
    result = relayer("partitions", "rotate", "billing", store=plain)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr
