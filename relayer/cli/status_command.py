"""``relayer status STORE``: members, lane owners, pending rows per lane, parked keys, health."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from relayer.cli.common import EXIT_OK, Context
from relayer.connection import connect
from relayer.health import StoreHealth
from relayer.status import StoreStatus, read_status


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "status",
        help="members, lane owners, pending rows and oldest age per lane, parked keys, health",
    )
    parser.add_argument("store")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_status)


async def _status(context: Context) -> int:
    store = context.store(context.arguments.store)
    async with await connect(store, purpose="status") as conn:
        status = await read_status(conn, store)
    if context.arguments.json:
        print(json.dumps(asdict(status), default=str, indent=2))
    else:
        print(render(status))
    return EXIT_OK


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
