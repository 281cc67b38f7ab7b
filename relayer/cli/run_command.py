"""``relayer run STORE [STORE ...]``: a worker process until SIGTERM/SIGINT, or with
``--processes N`` that many, supervised (relayer.cli.processes). ``--template NAME`` serves
every store the template's discovery source yields as well (relayer.fleet), joining and
leaving as the source changes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from relayer.cli.common import (
    EXIT_OK,
    EXIT_RUNTIME,
    Context,
    count,
    environment_option,
    positive_seconds,
    tcp_port,
    template_names,
)
from relayer.cli.processes import STOP_MARGIN, Supervisor, child_command, stop_with_supervisor
from relayer.deadlines import Deadlines
from relayer.errors import UsageError
from relayer.observability.metrics.backlog import DEFAULT_TOP_LANES, MAX_TOP_LANES
from relayer.settings import TemplateSettings

if TYPE_CHECKING:  # the worker is imported when it runs, not by every command's parser
    from relayer.settings import StoreSettings
    from relayer.worker import Worker

logger = logging.getLogger(__name__)


def register(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "run",
        help="relay the stores' outbox rows until SIGTERM/SIGINT (then finish and leave)",
    )
    parser.add_argument(
        "stores", nargs="*", metavar="STORE", help="stores to serve (optional with --template)"
    )
    # Every option also comes from the environment (docs/cli.md#run), for containers.
    _add_member_options(parser)
    _add_metrics_options(parser)
    parser.set_defaults(handler=_run)


def _add_member_options(parser: argparse.ArgumentParser) -> None:
    """What the process serves and as how many members."""
    environment_option(
        parser,
        "--instance-id",
        variable="RELAYER_INSTANCE_ID",
        help="member id (default: host:pid:random; with --processes, ID-0, ID-1, ...)",
    )
    environment_option(
        parser,
        "--template",
        variable="RELAYER_TEMPLATE",
        parse=template_names,
        default=(),
        metavar="NAME[,NAME...]",
        help="also serve every store these templates' discovery sources yield, as they come "
        "and go (docs/fleet.md)",
    )
    environment_option(
        parser,
        "--processes",
        variable="RELAYER_PROCESSES",
        parse=_processes,
        default=1,
        metavar="N|auto",
        help="run N member processes, each a full worker (auto: one per CPU; default: 1)",
    )


def _add_metrics_options(parser: argparse.ArgumentParser) -> None:
    """The Prometheus endpoint and what it exports."""
    environment_option(
        parser,
        "--metrics-port",
        variable="RELAYER_METRICS_PORT",
        parse=tcp_port,
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (needs the 'metrics' extra); "
        "with --processes, process i serves PORT+i",
    )
    environment_option(
        parser,
        "--metrics-host",
        variable="RELAYER_METRICS_HOST",
        default="0.0.0.0",  # a scrape target must be reachable by Prometheus
        metavar="HOST",
        help="address the metrics endpoint binds (default: 0.0.0.0)",
    )
    environment_option(
        parser,
        "--metrics-interval",
        variable="RELAYER_METRICS_INTERVAL",
        parse=positive_seconds,
        default=5.0,
        metavar="DURATION",
        help="how often the backlog gauges are re-read from the store (default: 5s)",
    )
    environment_option(
        parser,
        "--metrics-top-lanes",
        variable="RELAYER_METRICS_TOP_LANES",
        parse=count(0, MAX_TOP_LANES),
        default=DEFAULT_TOP_LANES,
        metavar="N",
        help="per-lane series for the N owned lanes whose head row is oldest, per store "
        f"(0: none; default: {DEFAULT_TOP_LANES})",
    )


async def _run(context: Context) -> int:
    arguments = context.arguments
    if not arguments.stores and not arguments.template:
        raise UsageError(
            "run: which stores? give STORE names, or --template NAME (RELAYER_TEMPLATE) to "
            "serve the stores a template's discovery source yields"
        )
    stores = [context.store(name) for name in arguments.stores]
    templates = [context.settings.template(name) for name in arguments.template]
    # Built before anything starts, also by the parent of --processes: every configuration
    # error (stores, templates, transports, worker settings) is reported once, before any
    # child runs.
    from relayer.fleet.discovery import Fleet
    from relayer.worker import Worker

    worker = Worker(stores, settings=context.settings.worker, instance_id=arguments.instance_id)
    fleet = Fleet(worker, templates) if templates else None  # its catalogs in the budget
    _check_transports(templates)
    if arguments.processes > 1:
        return await _supervise(arguments, [*stores, *templates])
    if not stop_with_supervisor():
        return EXIT_RUNTIME  # started by a supervisor that is gone already
    _tune_collector()
    with _stop_on_signals("finishing batches in flight, then leaving") as stop:
        metrics = await _serve_metrics(worker, arguments, stop)
        warnings = asyncio.create_task(_warn_once_started(worker, [*stores, *templates]))
        try:
            if fleet is not None:
                await fleet.run(stop)
            else:
                await worker.run(stop)
        finally:
            stop.set()
            warnings.cancel()
            if metrics is not None:
                await metrics
    return EXIT_OK


# The cyclic garbage collector's thresholds in a worker process: the youngest generation is
# collected every 10,000 allocations instead of 700 (a batch allocates a few objects per row,
# nearly all freed by reference counting, so most collections found nothing), and the objects
# of start-up (modules, settings, connections) are frozen out of the full collections.
GC_THRESHOLDS = (10_000, 50, 100)


def _tune_collector() -> None:
    """Tune the collector of this process (a worker's own process: never done by the library):
    the collections cost the worker's main thread about a quarter of its CPU per message in a
    drain (bench/efficiency.py, memory transport: 6.2-6.5 µs/msg, 4.8 with these settings)."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def _supervise(arguments: argparse.Namespace, stores: list[StoreSettings]) -> int:
    count = arguments.processes
    port = arguments.metrics_port
    if port and port + count - 1 > 65535:
        raise UsageError(
            f"--metrics-port: {port} is invalid with --processes {count}: process i serves "
            f"PORT+i, so PORT must be at most {65536 - count}"
        )
    longest_stop = max(Deadlines.of(store.lease_duration).stop for store in stores)
    supervisor = Supervisor(
        [child_command(arguments, index) for index in range(count)],
        stop_within=longest_stop + STOP_MARGIN,
    )
    logger.info(
        "starting %s worker processes for %s",
        count,
        ", ".join(store.name for store in stores),
        extra={"action": "processes_start"},
    )
    with _stop_on_signals("stopping every process", supervisor.forward) as stop:
        return await supervisor.run(stop)


@contextlib.contextmanager
def _stop_on_signals(
    doing: str, also: Callable[[int], None] = lambda signum: None
) -> Iterator[asyncio.Event]:
    """An event set by SIGTERM/SIGINT (logged once; ``also`` is told of every signal)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)

    def request_stop(signum: int) -> None:
        also(signum)
        if stop.is_set():
            return
        logger.info(
            "%s received: %s",
            signal.Signals(signum).name,
            doing,
            extra={"action": "shutdown"},
        )
        stop.set()

    for signum in signals:
        loop.add_signal_handler(signum, request_stop, signum)
    try:
        yield stop
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)


async def _warn_once_started(worker: Worker, stores: list[StoreSettings]) -> None:
    """Settings that start but will park rows, said once the worker runs (an error at
    start-up stays the only line)."""
    await worker.started.wait()
    for store in stores:
        if store.default_transport is None:
            section = "templates" if isinstance(store, TemplateSettings) else "stores"
            logger.warning(
                "%s %s has no default_transport: rows that name no transport will be parked "
                "until it is set; set %s.%s.default_transport, or pass transport=... to "
                "every write",
                "template" if section == "templates" else "store",
                store.name,
                section,
                store.name,
                extra={"action": "no_default_transport", "store": store.name},
            )


def _check_transports(templates: list[TemplateSettings]) -> None:
    """Build (and drop) each template's transports once: a bad transport setting is a
    configuration error now, not a warning for every store later."""
    from relayer.transports.registry import create_transports

    for template in templates:
        create_transports(template)


async def _serve_metrics(
    worker: Worker, arguments: argparse.Namespace, stop: asyncio.Event
) -> asyncio.Task[None] | None:
    """With --metrics-port: bind the endpoint now (a taken port fails start-up), refresh
    the backlog gauges until ``stop``."""
    if arguments.metrics_port is None:
        return None
    from relayer.observability.metrics import WorkerMetrics

    metrics = WorkerMetrics(
        worker, interval=arguments.metrics_interval, top_lanes=arguments.metrics_top_lanes
    )
    await metrics.serve(arguments.metrics_host, arguments.metrics_port)
    return asyncio.create_task(metrics.run(stop))


def _processes(text: str) -> int:
    if text == "auto":
        return os.cpu_count() or 1
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= 1024:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process count (1-1024 or auto)")
    return count
