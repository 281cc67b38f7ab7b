"""``relayer run STORE [STORE ...]``: a worker process until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from typing import Any

from relayer.cli.common import EXIT_OK, Context, tcp_port
from relayer.settings import StoreSettings
from relayer.worker import Worker

logger = logging.getLogger(__name__)


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "run",
        help="relay the stores' outbox rows until SIGTERM/SIGINT (then finish and leave)",
    )
    parser.add_argument("stores", nargs="+", metavar="STORE", help="stores to serve")
    parser.add_argument("--instance-id", help="member id (default: host:pid:random)")
    parser.add_argument(
        "--metrics-port",
        type=tcp_port,
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (needs the 'metrics' extra)",
    )
    parser.add_argument(
        "--metrics-host",
        default="0.0.0.0",  # a scrape target must be reachable by Prometheus
        metavar="HOST",
        help="address the metrics endpoint binds (default: 0.0.0.0)",
    )
    parser.add_argument(
        "--metrics-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how often the pending-rows gauges are re-read from the store (default: 5)",
    )
    parser.set_defaults(handler=_run)


async def _run(context: Context) -> int:
    stores = [context.store(name) for name in context.arguments.stores]
    worker = Worker(
        stores, settings=context.settings.worker, instance_id=context.arguments.instance_id
    )
    stop = asyncio.Event()
    metrics = await _serve_metrics(worker, context.arguments, stop)
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
    warnings = asyncio.create_task(_warn_once_started(worker, stores))
    try:
        await worker.run(stop)
    finally:
        stop.set()
        warnings.cancel()
        if metrics is not None:
            await metrics
        for signum in signals:
            loop.remove_signal_handler(signum)
    return EXIT_OK


async def _warn_once_started(worker: Worker, stores: list[StoreSettings]) -> None:
    """Settings that start but will park rows, said once the worker runs (an error at
    start-up stays the only line)."""
    await worker.started.wait()
    for store in stores:
        if store.default_transport is None:
            logger.warning(
                "store %s has no default_transport: rows that name no transport will be parked "
                "until it is set; set stores.%s.default_transport, or pass transport=... to "
                "every write",
                store.name,
                store.name,
                extra={"action": "no_default_transport", "store": store.name},
            )


async def _serve_metrics(
    worker: Worker, arguments: argparse.Namespace, stop: asyncio.Event
) -> asyncio.Task[None] | None:
    """With --metrics-port: bind the endpoint now (a taken port fails start-up), refresh
    the backlog gauges until ``stop``."""
    if arguments.metrics_port is None:
        return None
    from relayer.metrics import WorkerMetrics

    metrics = WorkerMetrics(worker, interval=arguments.metrics_interval)
    await metrics.serve(arguments.metrics_host, arguments.metrics_port)
    return asyncio.create_task(metrics.run(stop))
