"""``relayer status STORE``: members, lane owners, pending rows per lane, parked keys, health;
``relayer status --all``: one line per store, worst first; with ``--check`` (or ``--max-lag``)
a health check's exit status."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from relayer.cli import documents
from relayer.cli.common import EXIT_OK, EXIT_RUNTIME, Context, positive_seconds
from relayer.errors import UsageError

if TYPE_CHECKING:  # imported when the command runs, not by every command's parser
    from relayer.operations.health import StoreHealth
    from relayer.operations.status import StoreStatus, StoreSummary
    from relayer.settings import StoreSettings


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "status",
        help="members, lane owners, pending rows and oldest age per lane, parked keys, health",
    )
    parser.add_argument("store", nargs="?", help="the store to show (or --all)")
    parser.add_argument(
        "--all",
        action="store_true",
        help="one line per store, configured or listed by a template's source (pending, "
        "oldest age, parked keys, members), worst first",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when keys are parked (or, with --max-lag, a due row waited longer); "
        "0 otherwise",
    )
    parser.add_argument(
        "--max-lag",
        type=positive_seconds,
        metavar="DURATION",
        help="with --check (implied): fail when the oldest due row has waited longer ('30s', '5m')",
    )
    parser.set_defaults(handler=_status)


async def _status(context: Context) -> int:
    arguments = context.arguments
    checking = arguments.check or arguments.max_lag is not None
    if arguments.all:
        if arguments.store is not None:
            raise UsageError(f"give a store ({arguments.store!r}) or --all, not both")
        return await _status_all(context, checking)
    if arguments.store is None:
        raise UsageError("give the store to show, or --all for every configured store")
    from relayer.operations.status import read_status
    from relayer.store.driver import connect

    store = context.store(arguments.store)
    async with await connect(store, purpose="status") as conn:
        found = [await read_status(conn, store)]
    problems = [problem for status in found for problem in check(status, arguments.max_lag)]
    if arguments.json:
        document = documents.status(found[0])
        if checking:
            document["check"] = check_document(problems, arguments.max_lag)
        print(documents.dumps(document))
    else:
        print("\n\n".join(render(status) for status in found))
        if checking:
            print(render_check(problems))
    return EXIT_RUNTIME if checking and problems else EXIT_OK


async def fleet_stores(context: Context) -> tuple[list[StoreSettings], list[StoreSummary]]:
    """The stores ``status --all`` reads: every configured store and every store a template's
    source lists now; and a line for each source that cannot be read or row that breaks a
    rule (the command still reports the others)."""
    from relayer.operations.status import fleet_stores as read_fleet_stores

    settings = context.settings
    if not settings.stores and not settings.templates:
        raise UsageError(
            "no store or template is configured: give a TOML file with --config FILE or "
            "RELAYER_CONFIG"
        )
    return await read_fleet_stores(
        [settings.store(name) for name in settings.stores],
        [settings.template(name) for name in settings.templates],
    )


async def _status_all(context: Context, checking: bool) -> int:
    from relayer.operations.status import read_summaries

    max_lag = context.arguments.max_lag
    stores, unread = await fleet_stores(context)
    summaries = sorted([*unread, *await read_summaries(stores)], key=lambda found: found.rank)
    problems = [problem for summary in summaries for problem in check_summary(summary, max_lag)]
    if context.arguments.json:
        document = documents.fleet(summaries)
        if checking:
            document["check"] = check_document(problems, max_lag)
        print(documents.dumps(document))
    else:
        print(render_fleet(summaries))
        if checking:
            print(render_check(problems))
    return EXIT_RUNTIME if checking and problems else EXIT_OK


def check_summary(summary: StoreSummary, max_lag: float | None) -> list[str]:
    """What fails ``status --all --check`` for one store: it cannot be read, keys wait for an
    operator, or (with ``max_lag``) its oldest row waited longer."""
    problems: list[str] = []
    if summary.error:
        problems.append(f"store {summary.store!r}: cannot be read: {summary.error}")
    if summary.parked:
        problems.append(
            f"store {summary.store!r}: {summary.parked} parked key(s), "
            f"{summary.waiting_for_operator} waiting for an operator "
            f"(`relayer parked list {summary.store}`)"
        )
    if max_lag is not None and summary.oldest_age_seconds > max_lag:
        problems.append(
            f"store {summary.store!r}: the oldest row has waited "
            f"{summary.oldest_age_seconds:,.1f} s, more than --max-lag {max_lag:g} s"
        )
    return problems


def render_fleet(summaries: list[StoreSummary]) -> str:
    """One line per store, worst first (as read_summaries orders them)."""
    width = max([len("store"), *(len(summary.store) for summary in summaries)])
    lines = [
        f"{'store':<{width}}  {'pending':>10}  {'oldest s':>10}  {'parked':>6}  "
        f"{'operator':>8}  {'members':>7}"
    ]
    for summary in summaries:
        if summary.error:
            error = summary.error.removeprefix(f"store {summary.store!r}: ")
            lines.append(f"{summary.store:<{width}}  cannot be read: {error}")
            continue
        lines.append(
            f"{summary.store:<{width}}  {summary.pending:>10,}  "
            f"{summary.oldest_age_seconds:>10,.1f}  {summary.parked:>6,}  "
            f"{summary.waiting_for_operator:>8,}  {summary.members:>7,}"
        )
    return "\n".join(lines)


def check(status: StoreStatus, max_lag: float | None) -> list[str]:
    """What fails the health check: parked keys, and a due row older than ``max_lag`` s."""
    problems: list[str] = []
    if status.parked:
        waiting = sum(1 for key in status.parked if key.waiting_for_operator)
        problems.append(
            f"store {status.store!r}: {len(status.parked)} parked key(s), {waiting} waiting "
            f"for an operator (`relayer parked list {status.store}`)"
        )
    if max_lag is not None:
        lag = (
            status.oldest_age_seconds
            if status.health is None
            else status.health.oldest_due_age_seconds
        )
        if lag > max_lag:
            problems.append(
                f"store {status.store!r}: the oldest due row has waited {lag:,.1f} s, more "
                f"than --max-lag {max_lag:g} s"
            )
    return problems


def check_document(problems: list[str], max_lag: float | None) -> dict[str, Any]:
    return {"ok": not problems, "max_lag_seconds": max_lag, "problems": problems}


def render_check(problems: list[str]) -> str:
    if not problems:
        return "check: ok"
    return "\n".join(f"check failed: {problem}" for problem in problems)


def render(status: StoreStatus) -> str:
    lines = [f"store {status.store!r}: {status.lanes} lanes"]
    lines.append(f"members ({len(status.members)}):")
    for member in status.members:
        owned = sum(1 for owner in status.owners.values() if owner == member.instance)
        lines.append(f"  {member.instance}  lanes {owned}  up {member.age_seconds:,.0f} s")
    if not status.members:
        lines.append("  none live")
    unowned = status.lanes - len(status.owners)
    lines.append(
        f"lanes owned: {len(status.owners)} ({len(status.leased)} leased now), not owned: {unowned}"
    )
    lines.append(
        f"pending: {status.total_pending:,} rows, oldest {status.oldest_age_seconds:,.1f} s"
    )
    if status.pending:
        lines.append("  lane     rows   oldest s  owner")
        for lane in status.pending:
            label = "unord" if lane.lane is None else f"{lane.lane:>5}"
            owner = "" if lane.lane is None else status.owners.get(lane.lane, "-")
            lines.append(f"  {label} {lane.rows:>8,} {lane.oldest_age_seconds:>10,.1f}  {owner}")
    lines.append(f"parked keys: {len(status.parked)}")
    for parked in status.parked[:20]:
        state = (
            "needs operator" if parked.waiting_for_operator else f"retry {parked.retry_at:%H:%M:%S}"
        )
        lines.append(
            f"  {parked.key!r} lane {parked.lane} attempts {parked.attempts} rows "
            f"{parked.pending} {state}: {parked.last_error}"
        )
    if len(status.parked) > 20:
        lines.append(f"  ... {len(status.parked) - 20} more (relayer parked list {status.store})")
    if status.health is not None:
        lines.extend(render_health(status.health))
    return "\n".join(lines)


def render_health(health: StoreHealth) -> list[str]:
    lines = [f"health: oldest due row {health.oldest_due_age_seconds:,.1f} s"]
    lines.append("  table                          live      dead  dead %  last vacuum       size")
    for table in health.tables:
        vacuumed = "never" if table.last_vacuum is None else f"{table.last_vacuum:%m-%d %H:%M:%S}"
        lines.append(
            f"  {table.table:<26} {table.live_rows:>8,} {table.dead_rows:>9,} "
            f"{table.dead_ratio:>6.0%}  {vacuumed:<14} {_size(table.size_bytes):>9}"
        )
    for table in health.tables:
        if table.partitions is not None:
            lines.append(f"  {table.table}: the sum over its {table.partitions:,} partitions")
    if health.partitions_ahead_seconds is not None:
        lines.append(
            f"  the newest partition reaches {health.partitions_ahead_seconds:,.0f} s ahead "
            "of the database clock"
        )
    for warning in health.warnings:
        lines.append(f"  warning: {warning}")
    if not health.warnings:
        lines.append("  no warnings")
    return lines


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "kB", "MB"):
        if value < 1024:
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GB"
