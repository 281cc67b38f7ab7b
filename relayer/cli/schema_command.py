"""``relayer schema print|sql|apply|check STORE`` and ``relayer schema grants STORE``.

``print`` and ``sql`` need no database, and no configured store either: ``--schema``,
``--table-prefix`` and ``--lanes`` describe the store instead (or change a configured one's).
"""

from __future__ import annotations

import argparse
from typing import Any

from relayer.cli import documents
from relayer.cli.common import EXIT_OK, EXIT_RUNTIME, Context, count
from relayer.errors import ConfigurationError, UsageError
from relayer.operations import schema
from relayer.operations.grants import KINDS, render
from relayer.settings import StoreSettings, store_settings
from relayer.store.driver import connect

# The store settings the DDL depends on, as flags: (flag, setting, help).
_STORE_FLAGS = (
    ("--schema", "schema", "the PostgreSQL schema of the store's tables (default: public)"),
    ("--table-prefix", "table_prefix", "the prefix of the store's tables (default: relayer_)"),
    ("--lanes", "lanes", "the store's lane count (default: 64)"),
)


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "schema", help="print, apply or check a store's tables"
    )
    actions = parser.add_subparsers(dest="schema_action", metavar="ACTION", required=True)
    printing = actions.add_parser(
        "print", help="print the DDL apply would run on an empty database"
    )
    _describe_store(printing)
    printing.set_defaults(handler=_print)
    _register_sql(actions)
    for name, handler, text in (
        ("apply", _apply, "create or migrate the store's tables (idempotent, concurrency-safe)"),
        ("check", _check, "report drift between the database and this version (exit 1 on drift)"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("store", help="the store's name in the configuration")
        if name == "check":
            action.add_argument("--json", action="store_true", help="machine-readable output")
        action.set_defaults(handler=handler)
    grants = actions.add_parser(
        "grants", help="print the GRANT statements a writer, worker or operator role needs"
    )
    grants.add_argument("store", help="the store's name in the configuration")
    grants.add_argument("--role", required=True, help="the database role to grant to")
    grants.add_argument(
        "--for",
        dest="kind",
        required=True,
        choices=KINDS,
        help="what the role does: write rows (the application), run workers, or operate "
        "(status, parked, queue)",
    )
    grants.set_defaults(handler=_grants)


def _describe_store(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "store",
        nargs="?",
        help="the store's name in the configuration (none: the store the flags describe)",
    )
    for flag, setting, text in _STORE_FLAGS:
        parser.add_argument(flag, metavar=setting.upper(), help=text)


def _register_sql(actions: Any) -> None:
    latest = schema.latest_version()
    parser: argparse.ArgumentParser = actions.add_parser(
        "sql",
        help="print the DDL from one schema version to another, for a migration tool of your own",
    )
    _describe_store(parser)
    parser.add_argument(
        "--from",
        dest="start",
        metavar="VERSION",
        type=count(0, latest - 1),
        default=0,
        help="the version the database has (default 0: no relayer tables yet)",
    )
    parser.add_argument(
        "--to",
        dest="end",
        metavar="VERSION",
        type=count(1, latest),
        default=latest,
        help=f"the version to reach (default {latest}, this relayer's)",
    )
    parser.add_argument(
        "--no-transaction",
        dest="transaction",
        action="store_false",
        help="leave out BEGIN and COMMIT (for tools that run each migration in a transaction)",
    )
    parser.set_defaults(handler=_sql)


def described_store(context: Context) -> StoreSettings:
    """The configured STORE, or the flags' store, with the flags given instead of its values."""
    arguments = context.arguments
    given = {
        setting: getattr(arguments, setting)
        for _, setting, _ in _STORE_FLAGS
        if getattr(arguments, setting) is not None
    }
    if arguments.store is None:
        base: dict[str, Any] = {"name": "default"}
    else:
        store = context.store(arguments.store)
        if not given:
            return store
        base = {
            "name": store.name,
            "schema": store.db_schema,
            "table_prefix": store.table_prefix,
            "lanes": store.lanes,
        }
    try:
        return store_settings(**{**base, **given})
    except ConfigurationError as exc:
        flag = "--" + exc.field.rpartition(".")[2].replace("_", "-")
        raise UsageError(f"{flag}: {exc.value!r} is invalid: {exc.rule}") from None


async def _print(context: Context) -> int:
    print(schema.render(described_store(context)), end="")
    return EXIT_OK


async def _sql(context: Context) -> int:
    arguments = context.arguments
    if arguments.start >= arguments.end:
        raise UsageError(
            f"--from: {arguments.start} is invalid: it must be below --to ({arguments.end})"
        )
    store = described_store(context)
    script = schema.render(store, arguments.start, arguments.end, transaction=arguments.transaction)
    print(script, end="")
    return EXIT_OK


async def _grants(context: Context) -> int:
    store = context.store(context.arguments.store)
    print(render(store, context.arguments.kind, context.arguments.role), end="")
    return EXIT_OK


async def _apply(context: Context) -> int:
    store = context.store(context.arguments.store)
    async with await connect(store, purpose="schema", dsn=store.admin_dsn) as conn:
        result = await schema.apply(conn, store)
    where = f"{store.db_schema}.{store.table_prefix}*"
    if result.applied:
        print(f"store {store.name!r} ({where}): applied {', '.join(result.applied)}")
    else:
        print(f"store {store.name!r} ({where}): up to date")
    if result.lanes_changed_from is not None:
        print(f"lane count changed from {result.lanes_changed_from} to {result.lanes}")
    print(f"schema version {result.schema_version}, lanes {result.lanes}")
    return EXIT_OK


async def _check(context: Context) -> int:
    store = context.store(context.arguments.store)
    async with await connect(store, purpose="schema", dsn=store.admin_dsn) as conn:
        drift = await schema.check(conn, store)
    if context.arguments.json:
        found = documents.schema_check(store.name, schema.latest_version(), store.lanes, drift)
        print(documents.dumps(found))
        return EXIT_RUNTIME if drift else EXIT_OK
    if not drift:
        print(
            f"store {store.name!r}: matches schema version {schema.latest_version()} "
            f"(lanes {store.lanes})"
        )
        return EXIT_OK
    version = schema.latest_version()
    print(f"store {store.name!r}: {len(drift)} difference(s) from schema version {version}:")
    for item in drift:
        print(f"  {item}")
    return EXIT_RUNTIME
