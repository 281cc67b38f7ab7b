"""``relayer demo``: the embedded end-to-end demo."""

from __future__ import annotations

import argparse
from typing import Any

from relayer.cli.common import EXIT_OK, Context
from relayer.demo import run_demo


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo", help="run the end-to-end demo (embedded PostgreSQL unless a DSN is configured)"
    )
    parser.add_argument("--dsn", help="PostgreSQL to use (default: $RELAYER_DSN, else embedded)")
    parser.add_argument("--orders", type=int, default=300, help="orders to write (default 300)")
    parser.add_argument(
        "--customers", type=int, default=40, help="distinct ordering keys (default 40)"
    )
    parser.set_defaults(handler=_demo)


async def _demo(context: Context) -> int:
    arguments = context.arguments
    dsn = arguments.dsn or context.settings.dsn
    await run_demo(dsn, arguments.orders, arguments.customers, print)
    return EXIT_OK
