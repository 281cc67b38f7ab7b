"""``relayer run STORE [STORE ...]``: a worker process until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from relayer.cli.common import EXIT_OK, Context
from relayer.worker import Worker

logger = logging.getLogger(__name__)


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "run",
        help="relay the stores' outbox rows until SIGTERM/SIGINT (then finish and leave)",
    )
    parser.add_argument("stores", nargs="+", metavar="STORE", help="stores to serve")
    parser.add_argument("--instance-id", help="member id (default: host:pid:random)")
    parser.set_defaults(handler=_run)


async def _run(context: Context) -> int:
    stores = [context.store(name) for name in context.arguments.stores]
    worker = Worker(
        stores, settings=context.settings.worker, instance_id=context.arguments.instance_id
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)

    def request_stop(signum: int) -> None:
        if stop.is_set():
            return
        logger.info(
            "%s received: finishing batches in flight, then leaving",
            signal.Signals(signum).name,
            extra={"action": "shutdown"},
        )
        stop.set()

    for signum in signals:
        loop.add_signal_handler(signum, request_stop, signum)
    try:
        await worker.run(stop)
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
    return EXIT_OK
