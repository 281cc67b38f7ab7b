"""Tables that drifted, a schema never applied or left behind, and a lane count that differs.

`relayer schema check` exits 1 listing each difference; workers (`relayer run` and the
programmatic Worker) refuse to start with one line saying what differs and what to run; the
writer refuses a lane count or schema it cannot use, naming both numbers; nothing is changed.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from relayer import LaneCountMismatchError, Outbox, SchemaNotAppliedError
from relayer.errors import MissingPrivilegeError, SchemaDriftError
from relayer.operations import schema
from relayer.operations.schema import latest_version
from relayer.settings import StoreSettings
from relayer.worker import Worker
from tests.acceptance.cli import environment
from tests.badinput.support import SECRETS, CliCase, catalog, run_cases, with_password
from tests.conftest import apply_schema, make_store

STORE = "RELAYER_STORES__ORDERS__"
MEMORY = {STORE + "TRANSPORTS__MEMORY__TYPE": "memory", STORE + "DEFAULT_TRANSPORT": "memory"}
VERSION = latest_version()
BARE = {STORE + "TABLE_PREFIX": "bare_"}
# Every operator command that reads or changes a store's tables (a store never applied).
OPERATOR_COMMANDS = (
    ("status",),
    ("status", "--json"),
    ("parked", "list"),
    ("parked", "redrive"),
    ("parked", "drop", "--yes"),
    ("queue", "status"),
    ("queue", "pause"),
)


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    settings = make_store(with_password(pg_dsn))
    await apply_schema(settings)
    return settings


def refusal(result: object, status: int = 1) -> str:
    """The last line of a refused command (a worker's shutdown log line may come before)."""
    output = result.stdout + result.stderr  # type: ignore[attr-defined]
    assert result.returncode == status, output  # type: ignore[attr-defined]
    for secret in SECRETS:
        assert secret not in output
    return str(result.stderr).strip().splitlines()[-1]  # type: ignore[attr-defined]


async def test_drift_is_listed_and_workers_refuse_to_start(
    store: StoreSettings, tmp_path: Path
) -> None:
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute("ALTER TABLE orders_outbox DROP COLUMN last_error")
        conn.execute("DROP INDEX orders_parked_lane")
        conn.execute("ALTER TABLE orders_leases ADD COLUMN surprise text")
    before = catalog(store.require_dsn())
    results = run_cases(
        [CliCase("check", ("schema", "check", "orders")), CliCase("run", ("run", "orders"))],
        tmp_path,
        environment(store, **MEMORY),
    )
    check = results["check"]
    assert check.returncode == 1, check.stderr
    assert check.stdout.splitlines() == [
        f"store 'orders': 3 difference(s) from schema version {VERSION}:",
        "  public.orders_leases: column surprise is not part of relayer's schema",
        "  public.orders_outbox: column last_error missing",
        "  public.orders_parked: index orders_parked_lane missing",
    ]
    expected = (
        f"store 'orders': its tables differ from schema version {VERSION} "
        "(public.orders_leases: column surprise is not part of relayer's schema; "
        "public.orders_outbox: column last_error missing; public.orders_parked: index "
        "orders_parked_lane missing); restore them as `relayer schema print orders` shows, "
        "until `relayer schema check orders` passes"
    )
    assert refusal(results["run"]) == f"relayer: {expected}"
    with pytest.raises(SchemaDriftError) as caught:
        await Worker([store], transports={"orders": {}}).run()
    assert str(caught.value) == expected
    assert catalog(store.require_dsn()) == before


async def test_a_schema_never_applied_or_left_behind_is_refused(
    pg_dsn: str, store: StoreSettings, tmp_path: Path
) -> None:
    bare = make_store(with_password(pg_dsn), table_prefix="bare_")
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute("UPDATE orders_meta SET schema_version = %s", (VERSION - 1,))
    before = catalog(pg_dsn)
    results = run_cases(
        [
            CliCase("old-run", ("run", "orders")),
            CliCase("old-check", ("schema", "check", "orders")),
            CliCase("bare-run", ("run", "orders"), {STORE + "TABLE_PREFIX": "bare_"}),
            *(
                CliCase(f"bare-{'-'.join(arguments)}", (*arguments, "orders"), BARE)
                for arguments in OPERATOR_COMMANDS
            ),
        ],
        tmp_path,
        environment(store, **MEMORY),
    )
    old = (
        f"store 'orders': schema version {VERSION - 1} is older than this relayer's {VERSION}; "
        "run `relayer schema apply orders`"
    )
    assert refusal(results["old-run"], 2) == f"relayer: error: {old}"
    assert results["old-check"].returncode == 1
    assert f"  schema_version: {VERSION - 1}; pending: 000{VERSION}_" in results["old-check"].stdout
    never = (
        "store 'orders': no relayer tables in schema 'public' with prefix 'bare_'; run "
        "`relayer schema apply orders` first"
    )
    assert refusal(results["bare-run"], 2) == f"relayer: error: {never}"
    for arguments in OPERATOR_COMMANDS:
        result = results[f"bare-{'-'.join(arguments)}"]
        assert result.stderr.strip().splitlines() == [f"relayer: error: {never}"], arguments
        assert result.returncode == 2 and result.stdout == "", arguments
    for settings, message in ((store, old), (bare, never)):
        with psycopg.connect(pg_dsn) as conn:
            with pytest.raises(SchemaNotAppliedError) as caught:
                Outbox(settings).write(conn, destination="events", body=b"{}", key="k")
            assert str(caught.value) == message
    assert catalog(pg_dsn) == before


async def test_a_lane_count_mismatch_is_refused_by_writer_and_worker(
    store: StoreSettings, tmp_path: Path
) -> None:
    with psycopg.connect(store.require_dsn()) as conn:
        Outbox(store).write(conn, destination="events", body=b"{}", key="customer-7")
        conn.commit()
    wider = make_store(store.require_dsn(), lanes=32)
    expected = (
        "store 'orders': configured lanes=32 but the store was created with lanes=16; use "
        "lanes=16, or drain the outbox and re-apply the schema to change the lane count"
    )
    before = catalog(store.require_dsn())
    results = run_cases(
        [
            CliCase("run", ("run", "orders")),
            CliCase("apply", ("schema", "apply", "orders")),
            CliCase("check", ("schema", "check", "orders")),
        ],
        tmp_path,
        environment(store, **MEMORY, **{STORE + "LANES": "32"}),
    )
    assert refusal(results["run"]) == f"relayer: {expected}"
    assert refusal(results["apply"]) == f"relayer: {expected}"
    assert results["check"].returncode == 1
    assert "  lanes: recorded 16, configured 32" in results["check"].stdout.splitlines()
    with psycopg.connect(store.require_dsn()) as conn:
        conn.execute("CREATE TABLE shop_orders (id integer)")
        with pytest.raises(LaneCountMismatchError) as caught:
            Outbox(wider).write(conn, destination="events", body=b"{}", key="customer-7")
        assert str(caught.value) == expected
        assert (caught.value.configured, caught.value.recorded) == (32, 16)
        conn.rollback()
    with pytest.raises(LaneCountMismatchError) as caught:
        await Worker([wider], transports={"orders": {}}).run()
    assert str(caught.value) == expected
    assert catalog(store.require_dsn()) == before


async def test_a_role_without_temp_privilege_still_starts(store: StoreSettings) -> None:
    """The drift comparison builds temporary tables; a role that may not is not refused."""
    role = f"relayer_no_temp_{uuid.uuid4().hex[:8]}"
    dsn = store.require_dsn()
    database = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC").format(sql.Identifier(database))
        )
        conn.execute(
            sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(
                sql.Identifier(role)
            )
        )
    try:
        limited = psycopg.conninfo.make_conninfo(dsn, user=role)
        async with await psycopg.AsyncConnection.connect(limited, autocommit=True) as conn:
            with pytest.raises(MissingPrivilegeError, match="needs the TEMPORARY privilege"):
                await schema.check(conn, store)
            assert (await schema.require_meta(conn, store)).lanes == store.lanes
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
