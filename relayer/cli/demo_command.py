"""``relayer demo``: the embedded end-to-end demo."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from relayer.cli.common import EXIT_OK, Context


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo",
        help="write orders, relay them with two workers to Kafka and verify per-key order "
        "(embedded PostgreSQL and broker unless configured)",
    )
    parser.add_argument("--dsn", help="PostgreSQL to use (default: $RELAYER_DSN, else embedded)")
    parser.add_argument(
        "--kafka-bootstrap", help="Kafka to use (default: the embedded Kafka-protocol broker)"
    )
    parser.add_argument(
        "--live-orders", type=int, default=500, help="orders written one per transaction"
    )
    parser.add_argument(
        "--backlog-orders", type=int, default=30_000, help="orders written 1,000 per transaction"
    )
    parser.add_argument(
        "--customers", type=int, default=50, help="distinct ordering keys (default 50)"
    )
    parser.set_defaults(handler=_demo)


async def _demo(context: Context) -> int:
    from relayer.demo import run_demo  # the worker, brokers, embedded services: on use only

    arguments = context.arguments
    if arguments.log_level is None:
        # The demo narrates what happens; workers' routine INFO lines would drown it.
        logging.getLogger("relayer").setLevel(logging.WARNING)
    dsn = arguments.dsn or context.settings.dsn
    await run_demo(
        dsn,
        arguments.kafka_bootstrap,
        live_orders=arguments.live_orders,
        backlog_orders=arguments.backlog_orders,
        customers=arguments.customers,
        say=print,
    )
    return EXIT_OK
