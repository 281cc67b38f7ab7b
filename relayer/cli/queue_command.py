"""``relayer queue pause|resume|limit|status STORE``: cluster-wide dispatch controls.

A store's queue is named after the store unless ``--queue`` says otherwise; ``--all`` pauses
(or lifts the pause of) every queue of the store. Workers see a change on their next claim.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from relayer.cli import documents
from relayer.cli.common import EXIT_OK, Context
from relayer.dispatch.control import (
    QueueControl,
    QueueStatus,
    default_actor,
    require_dispatch_schema,
)
from relayer.dispatch.policies import ALL_QUEUES
from relayer.operations.queues import change_queue, parse_limit
from relayer.settings import StoreSettings
from relayer.store.driver import connect


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "queue", help="pause, resume or limit a store's dispatch queue across the cluster"
    )
    actions = parser.add_subparsers(dest="queue_action", metavar="ACTION", required=True)

    pause = actions.add_parser("pause", help="stop every worker claiming from the queue")
    resume = actions.add_parser("resume", help="let workers claim from the queue again")
    for action, handler in ((pause, _pause), (resume, _resume)):
        action.add_argument("store", help="the store's name in the configuration")
        which = action.add_mutually_exclusive_group()
        which.add_argument("--queue", help="the queue (default: the store's name)")
        which.add_argument(
            "--all", action="store_true", help="every queue of the store (the '*' pause)"
        )
        action.add_argument("--reason", help="why, for the audit trail and `queue status`")
        action.add_argument("--by", help="who, for the audit trail (default: user@host:pid)")
        action.set_defaults(handler=handler)

    limit = actions.add_parser("limit", help="cap the queue's running jobs across the cluster")
    limit.add_argument("store", help="the store's name in the configuration")
    limit.add_argument(
        "limit", metavar="N|none", help="an integer from 1 to 2147483647, or 'none' for no cap"
    )
    limit.add_argument("--queue", help="the queue (default: the store's name)")
    limit.add_argument("--reason", help="why, for the audit trail")
    limit.add_argument("--by", help="who, for the audit trail (default: user@host:pid)")
    limit.set_defaults(handler=_limit)

    status = actions.add_parser("status", help="pause state, limit and slots in use per queue")
    status.add_argument("store", help="the store's name in the configuration")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=_status)


async def _pause(context: Context) -> int:
    return await _change(context, pause=True)


async def _resume(context: Context) -> int:
    return await _change(context, pause=False)


async def _change(context: Context, *, pause: bool) -> int:
    arguments = context.arguments
    store = context.store(arguments.store)
    queue = None if arguments.all else (arguments.queue or store.name)
    actor = arguments.by or default_actor()
    async with await connect(store, purpose="queue") as conn:
        action = "pause" if pause else "resume"
        await change_queue(conn, store, action, queue=queue, by=actor, reason=arguments.reason)
        states = await QueueControl(conn, store.names).status([] if queue is None else [queue])
    what = "all queues" if queue is None else f"queue {queue!r}"
    because = f" (reason: {arguments.reason})" if arguments.reason else ""
    print(f"store {store.name!r}: {what} {'paused' if pause else 'resumed'} by {actor}{because}")
    every = next((state for state in states if state.queue == ALL_QUEUES), None)
    if not pause and queue is not None and every is not None and every.paused:
        print(f"note: every queue of store {store.name!r} is still paused (`--all`)")
    if not pause and queue is None:
        for state in states:
            if state.queue != ALL_QUEUES and state.paused:
                print(f"note: queue {state.queue!r} stays paused by its own pause")
    return EXIT_OK


async def _limit(context: Context) -> int:
    arguments = context.arguments
    limit = parse_limit(arguments.limit)
    store = context.store(arguments.store)
    queue = arguments.queue or store.name
    actor = arguments.by or default_actor()
    async with await connect(store, purpose="queue") as conn:
        await change_queue(
            conn, store, "limit", queue=queue, by=actor, reason=arguments.reason, limit=limit
        )
    cap = "no limit" if limit is None else f"at most {limit} running at once"
    print(f"store {store.name!r}: queue {queue!r}: {cap} (set by {actor})")
    return EXIT_OK


async def _status(context: Context) -> int:
    store = context.store(context.arguments.store)
    async with await connect(store, purpose="queue") as conn:
        await require_dispatch_schema(conn, store)
        states = await QueueControl(conn, store.names).status([store.name])
    if context.arguments.json:
        table = f"{store.db_schema}.{store.names.table('queues')}"
        print(documents.dumps(documents.queue_status(store.name, table, states)))
    else:
        print(render(store, states))
    return EXIT_OK


def render(store: StoreSettings, states: tuple[QueueStatus, ...]) -> str:
    every = next((state for state in states if state.queue == ALL_QUEUES), None)
    all_paused = every is not None and every.paused
    header = ("QUEUE", "STATE", "LIMIT", "IN USE", "CHANGED BY", "CHANGED AT", "REASON")
    rows = [header]
    for state in states:
        if state.queue == ALL_QUEUES:
            name, running = "* (all queues)", "paused" if state.paused else "running"
        else:
            name = state.queue
            running = "paused" if state.paused else "paused (all)" if all_paused else "running"
        rows.append(
            (
                name,
                running,
                "-" if state.limit is None else str(state.limit),
                "-" if state.slots_in_use is None else str(state.slots_in_use),
                state.changed_by or "-",
                _when(state.changed_at),
                state.reason or "-",
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = [f"store {store.name!r} ({store.db_schema}.{store.names.table('queues')}):"]
    for row in rows:
        lines.append(
            "  "
            + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return "\n".join(lines)


def _when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
