"""``relayer partitions rotate STORE [--json]``: one rotation of a partitioned store's
partitions through its ``admin_dsn`` (else its ``dsn``), for a cron job where the workers' role
may not create or drop partitions (docs/storage.md#rotation)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from relayer.cli import documents
from relayer.cli.common import EXIT_OK, EXIT_RUNTIME, Context

if TYPE_CHECKING:  # imported when the command runs, not by every command's parser
    from relayer.operations.partitions import RotationReport


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "partitions", help="rotate a partitioned store's partitions"
    )
    actions = parser.add_subparsers(dest="partitions_action", metavar="ACTION", required=True)
    rotate = actions.add_parser(
        "rotate",
        help="create the partitions ahead and drop those every lane has passed, once, through "
        "the store's admin_dsn (else its dsn)",
    )
    rotate.add_argument("store", help="the store's name in the configuration")
    rotate.add_argument("--json", action="store_true", help="machine-readable output")
    rotate.set_defaults(handler=_rotate)


async def _rotate(context: Context) -> int:
    from relayer.operations.partitions import rotate_partitions

    report = await rotate_partitions(context.store(context.arguments.store))
    if context.arguments.json:
        print(documents.dumps(documents.rotation(report)))
    else:
        print(render(report))
    skipped = report.rotation.skipped
    if skipped is None:
        return EXIT_OK
    print(
        f"relayer: store {report.store!r}: the rotation stopped early: {skipped}; run it "
        "again (each step is safe to repeat)",
        file=sys.stderr,
    )
    return EXIT_RUNTIME


def render(report: RotationReport) -> str:
    done, found = report.rotation, report.partitions
    lines = [f"store {report.store!r}:"]
    for label, names in (
        ("created", done.created),
        ("dropped", done.dropped),
        ("finalized", done.finalized),
    ):
        lines.append(f"  {label:<10} {len(names):>3}  {' '.join(names)}".rstrip())
    lines.append(f"  skipped    {'no' if done.skipped is None else done.skipped}")
    lines.append(
        f"  {found.partitions:,} partitions, {found.size_bytes:,} bytes; the newest reaches "
        f"{found.ahead_seconds:,.0f} s ahead of the database clock"
    )
    return "\n".join(lines)
