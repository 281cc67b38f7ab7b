"""``relayer parked list|redrive|drop STORE [--key KEY]``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from relayer.cli import documents
from relayer.cli.common import EXIT_OK, EXIT_RUNTIME, Context
from relayer.errors import UsageError

if TYPE_CHECKING:  # imported when the command runs, not by every command's parser
    from relayer.operations.parked import KeyChange
    from relayer.settings import StoreSettings


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "parked", help="list, redrive or drop parked ordering keys"
    )
    actions = parser.add_subparsers(dest="parked_action", metavar="ACTION", required=True)
    for name, handler, text in (
        ("list", _list, "show parked keys with their error and pending rows"),
        ("redrive", _redrive, "send a parked key again from its head, in order"),
        ("drop", _drop, "delete a parked key's pending rows (cannot be undone)"),
    ):
        action = actions.add_parser(name, help=text)
        action.add_argument("store")
        action.add_argument("--key", help="one ordering key (default: every parked key)")
        if name == "list":
            action.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "drop":
            action.add_argument(
                "--yes", action="store_true", help="confirm dropping every parked key"
            )
        action.set_defaults(handler=handler)


async def _list(context: Context) -> int:
    from relayer.operations import parked
    from relayer.store.driver import connect

    store = context.store(context.arguments.store)
    async with await connect(store, purpose="parked") as conn:
        keys = await parked.list_parked(conn, store, context.arguments.key)
    if context.arguments.json:
        print(documents.dumps(documents.parked_list(store.name, keys)))
        return EXIT_OK
    if not keys:
        print(f"store {store.name!r}: no parked keys")
        return EXIT_OK
    for key in keys:
        state = (
            "waiting for an operator"
            if key.waiting_for_operator
            else f"retry at {key.retry_at:%Y-%m-%d %H:%M:%S%z}"
        )
        print(
            f"{key.key!r}: lane {key.lane}, {key.pending} pending row(s), attempts "
            f"{key.attempts}, parked {key.parked_at:%Y-%m-%d %H:%M:%S%z}, {state}\n"
            f"    head {key.head_id}: {key.last_error}"
        )
    return EXIT_OK


async def _redrive(context: Context) -> int:
    from relayer.operations import parked
    from relayer.store.driver import connect

    store = context.store(context.arguments.store)
    async with await connect(store, purpose="parked") as conn:
        changes = await parked.redrive(conn, store, context.arguments.key)
    for change in changes:
        print(f"redriven {change.key!r}: {change.rows} row(s) will be sent again, in order")
    return _outcome(context, store, changes, "redrive")


async def _drop(context: Context) -> int:
    from relayer.operations import parked
    from relayer.store.driver import connect

    store = context.store(context.arguments.store)
    if context.arguments.key is None and not context.arguments.yes:
        raise UsageError(
            f"parked drop {store.name} without --key drops every parked key's rows for good; "
            "pass --key KEY for one key, or --yes to drop them all"
        )
    async with await connect(store, purpose="parked") as conn:
        changes = await parked.drop(conn, store, context.arguments.key)
    for change in changes:
        print(f"dropped {change.key!r}: {change.rows} row(s) deleted")
    return _outcome(context, store, changes, "drop")


def _outcome(context: Context, store: StoreSettings, changes: list[KeyChange], action: str) -> int:
    """Nothing to change is fine for every parked key, a failure for a named one (a typo, or
    a key that is not parked: an operator must not believe it was redriven)."""
    if changes:
        return EXIT_OK
    key = context.arguments.key
    if key is None:
        print(f"store {store.name!r}: no parked key to {action}")
        return EXIT_OK
    print(
        f"relayer: store {store.name!r}: key {key!r} is not parked, nothing to {action}; "
        f"`relayer parked list {store.name}` shows the parked keys",
        file=sys.stderr,
    )
    return EXIT_RUNTIME
