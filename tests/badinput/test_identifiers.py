"""Hostile identifiers and arguments against a real database: refused, or kept as plain values.

Schema names, table prefixes and store names are identifiers: anything but a plain one is
refused at start-up (exit 2, one line) and the database is left exactly as it was, catalog and
rows. Ordering keys, queue names and reasons are values: quotes and semicolons in them reach
PostgreSQL only as bound parameters, so they select or record exactly what they say.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from relayer import Outbox
from relayer.settings import STORE_NAME_RULE, StoreSettings
from tests.acceptance.cli import environment, relayer
from tests.badinput.support import CliCase, catalog, error_line, run_cases, with_password
from tests.conftest import apply_schema, make_store

STORE = "RELAYER_STORES__ORDERS__"
HOSTILE = ['x"; drop table y; --', "public; DROP SCHEMA public CASCADE", "Orders", "ünïcode"]
PLAIN_RULE = (
    "must be a plain identifier: a lowercase letter or '_' followed by lowercase letters, digits "
    "or '_' (pattern ^[a-z_][a-z0-9_]*$)"
)
INJECTION = "'); DROP TABLE orders_outbox; --"


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    settings = make_store(with_password(pg_dsn))
    await apply_schema(settings)
    return settings


APPLY = ("schema", "apply", "orders")


def refused_cases() -> list[tuple[CliCase, str]]:
    cases: list[tuple[CliCase, str]] = []

    def refused(case: CliCase, expected: str) -> None:
        cases.append((case, expected))

    for number, name in enumerate(HOSTILE):
        for setting, field in (("SCHEMA", "schema"), ("TABLE_PREFIX", "table_prefix")):
            refused(
                CliCase(f"{field}-{number}", APPLY, {STORE + setting: name}),
                f"stores.orders.{field}: {name!r} is invalid: {PLAIN_RULE}",
            )
    prefix = "p" * 50
    refused(
        CliCase("long-prefix", APPLY, {STORE + "TABLE_PREFIX": prefix}),
        f"stores.orders.table_prefix: {prefix!r} is invalid: the longest table or index name it "
        f"produces, {prefix + 'queue_events_q'!r}, would be 64 bytes; PostgreSQL names are at "
        "most 63 bytes, so use a prefix of at most 49 bytes",
    )
    toml = f'[stores.orders]\nschema = "{HOSTILE[1]}"\n'
    for arguments in (
        ("run", "orders"),
        ("status", "orders"),
        ("parked", "list", "orders"),
        ("queue", "pause", "orders"),
        ("schema", "check", "orders"),
    ):
        refused(
            CliCase("toml-" + "-".join(arguments[:-1]), arguments, toml=toml),
            f"stores.orders.schema: {HOSTILE[1]!r} is invalid: {PLAIN_RULE}",
        )
    for number, name in enumerate((f"orders{INJECTION}", "../orders")):
        refused(
            CliCase(f"store-argument-{number}", ("schema", "apply", name)),
            f"store: {name!r} is invalid: {STORE_NAME_RULE}",
        )
    name = "o" + INJECTION
    refused(
        CliCase("toml-store-name", ("status", "orders"), toml=f'[stores."{name}"]\n'),
        f"stores.{name}.name: {name!r} is invalid: {STORE_NAME_RULE}",
    )
    refused(
        CliCase("queue-star", ("queue", "pause", "orders", "--queue", "*")),
        "queue: '*' is invalid: '*' cannot name a queue: it stands for every queue in pause and "
        "resume",
    )
    queue = INJECTION * 8
    refused(
        CliCase("queue-too-long", ("queue", "limit", "orders", "2", "--queue", queue)),
        f"queue: {queue!r} is invalid: queue name {queue[:40]!r}... is {len(queue)} "
        "characters; the limit is 200",
    )
    return cases


def store_env(store: StoreSettings) -> dict[str, str]:
    """The store through the environment, its schema left to each case (or the default)."""
    return {
        STORE + "DSN": store.require_dsn(),
        STORE + "TABLE_PREFIX": store.table_prefix,
        STORE + "LANES": str(store.lanes),
    }


async def test_hostile_identifiers_are_refused_and_touch_nothing(
    store: StoreSettings, tmp_path: Path
) -> None:
    cases = refused_cases()
    before = catalog(store.require_dsn())
    results = run_cases([case for case, _ in cases], tmp_path, store_env(store))
    assert catalog(store.require_dsn()) == before
    for case, expected in cases:
        line = error_line(results[case.name])
        assert line == f"relayer: error: {expected}", case.name


def park(store: StoreSettings, keys: list[str]) -> None:
    """One row per key, each key parked waiting for an operator (as a permanent error does)."""
    outbox = Outbox(store)
    with psycopg.connect(store.require_dsn()) as conn:
        for key in keys:
            row_id = outbox.write(conn, destination="events", key=key, body=key.encode())
            conn.execute(
                "INSERT INTO orders_parked (ordering_key, lane, head_id, attempts, last_error) "
                "SELECT ordering_key, lane, id, 1, 'broker said no' FROM orders_outbox "
                "WHERE id = %s",
                (row_id,),
            )
        conn.commit()


def outbox_keys(store: StoreSettings) -> list[str]:
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute("SELECT ordering_key FROM orders_outbox ORDER BY id").fetchall()
    return [row[0] for row in rows]


async def test_hostile_keys_and_queue_names_are_plain_values(store: StoreSettings) -> None:
    hostile = [INJECTION, 'say "hi"; --', "semi;colon", "tab\there"]
    park(store, hostile)
    structure = {key: value for key, value in catalog(store.require_dsn()).items() if key != "rows"}
    env = environment(store)

    listed = relayer("parked", "list", "orders", "--key", INJECTION, env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith(f"{INJECTION!r}: lane ")
    assert "1 pending row(s)" in listed.stdout and "broker said no" in listed.stdout
    assert len(listed.stdout.splitlines()) == 2  # that key only: one line and its error

    missing = relayer("parked", "redrive", "orders", "--key", f"{INJECTION}x", env=env)
    assert missing.returncode == 1, missing.stderr
    assert missing.stderr.strip() == (
        f"relayer: store 'orders': key {INJECTION + 'x'!r} is not parked, nothing to redrive; "
        "`relayer parked list orders` shows the parked keys"
    )

    dropped = relayer("parked", "drop", "orders", "--key", hostile[1], env=env)
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout.strip() == f"dropped {hostile[1]!r}: 1 row(s) deleted"
    assert outbox_keys(store) == [INJECTION, *hostile[2:]]

    paused = relayer(
        "queue", "pause", "orders", "--queue", INJECTION, "--reason", hostile[1], env=env
    )
    assert paused.returncode == 0, paused.stderr
    status = relayer("queue", "status", "orders", env=env)
    assert status.returncode == 0, status.stderr
    [row] = [line for line in status.stdout.splitlines() if line.lstrip().startswith(INJECTION)]
    assert "paused" in row and hostile[1] in row

    after = catalog(store.require_dsn())
    assert {key: value for key, value in after.items() if key != "rows"} == structure
    assert after["rows"]["public.orders_outbox"] == len(hostile) - 1
