"""``relayer schema print|apply|check STORE`` and ``relayer schema grants STORE``."""

from __future__ import annotations

import argparse
from typing import Any

from relayer.cli import documents
from relayer.cli.common import EXIT_OK, EXIT_RUNTIME, Context
from relayer.operations import schema
from relayer.operations.grants import KINDS, render
from relayer.store.driver import connect


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "schema", help="print, apply or check a store's tables"
    )
    actions = parser.add_subparsers(dest="schema_action", metavar="ACTION", required=True)
    for name, handler, text in (
        ("print", _print, "print the DDL apply would run on an empty database"),
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


async def _print(context: Context) -> int:
    print(schema.render(context.store(context.arguments.store)), end="")
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
