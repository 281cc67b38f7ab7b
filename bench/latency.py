"""Commit-to-acknowledgement latency at a steady write rate.

    python bench/latency.py [--rate 1000] [--seconds 20] [--transport memory|kafka]
                            [--kafka-option linger.ms=1 ...] [--notify MODE] [--idle N]

A writer process commits one outbox row per transaction at ``--rate`` rows/s (spread over a
few connections) and records each row's commit time. One worker in this process relays them;
a thin wrapper around its transport records when the broker acknowledged each message. The
latency of a row is acknowledgement time minus commit time (both wall clock on this machine).
Prints p50/p90/p99/max after a warm-up. Never asserts on time.

``--idle N``: idle to first delivery instead. One writer process commits N single rows, one at a
time, each after a pause of 1.2-2 s in which the row before it was delivered and the worker had
nothing to do (nothing pending, no scan running, no longer polling hot): how soon a lone write
reaches the broker with the store's wake-up (``--notify``, the store setting; default after_commit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from bench.common import machine, postgres, scratch_schema, server_version
from bench.relay import applied
from relayer import Outbox
from relayer.settings import StoreSettings, WorkerSettings, store_settings
from relayer.transports.base import (
    BatchPublisher,
    OutboundBatch,
    OutgoingMessage,
    Transport,
)
from relayer.transports.memory import MemoryTransport
from relayer.transports.routing import PerMessage
from relayer.worker import Worker

WRITERS = 4
# --idle: seconds between two lone rows, longer than a store stays hot after a wake-up
# (relayer.store.notifier.HOT_HOLD), so that each row finds the store idle and cold.
IDLE_GAP = (1.2, 2.0)


class AckClock:
    """Wraps a transport and notes the wall-clock time each message was acknowledged."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.acked: dict[str, float] = {}
        # Asked once: the runtime protocol check costs several µs a batch, which the worker
        # itself does not pay (relayer.transports.routing.Routing.publisher).
        self.batches = isinstance(inner, BatchPublisher)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def pipelines_within_key(self) -> bool:
        return self.inner.pipelines_within_key

    async def start(self) -> None:
        await self.inner.start()

    async def ordered_by_key(self, destination: str) -> bool:
        return await self.inner.ordered_by_key(destination)

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        acknowledgement = asyncio.ensure_future(await self.inner.publish(message))
        acknowledgement.add_done_callback(
            lambda done: (
                self.acked.__setitem__(str(message.id), time.time())
                if not done.cancelled() and done.exception() is None
                else None
            )
        )
        return acknowledgement

    async def publish_batch(
        self,
        batch: OutboundBatch,
        indexes: Sequence[int],
        settle: Callable[[int, BaseException | None], None],
        admitting: Callable[[], bool],
    ) -> int:
        """The relay's batch path (without it the relay would publish through ``publish``, a
        future per message, and this would time a path the relay does not take)."""
        if not self.batches:
            return await PerMessage(self).publish_batch(batch, indexes, settle, admitting)
        ids, acked = batch.ids, self.acked

        def timed(index: int, error: BaseException | None) -> None:
            if error is None:
                acked[ids[index]] = time.time()
            settle(index, error)

        return int(await self.inner.publish_batch(batch, indexes, timed, admitting))

    async def close(self) -> None:
        await self.inner.close()


def write_steadily(
    store: StoreSettings, destination: str, rate: float, seconds: float, out: str, index: int
) -> None:
    """One writer connection: rate / WRITERS transactions per second, one row each."""
    outbox = Outbox(store)
    interval = WRITERS / rate
    committed: dict[str, float] = {}
    with psycopg.connect(store.require_dsn()) as conn:
        started = time.perf_counter()
        number = 0
        while (elapsed := time.perf_counter() - started) < seconds:
            pause = number * interval - elapsed
            if pause > 0:
                time.sleep(pause)
            message_id = outbox.write(
                conn, destination=destination, body=b"x" * 200, key=f"key-{index}-{number % 250}"
            )
            conn.commit()
            committed[str(message_id)] = time.time()
            number += 1
    Path(out).write_text(json.dumps(committed))


def write_idly(store: StoreSettings, destination: str, count: int, out: str) -> None:
    """One writer connection: ``count`` transactions of one row, IDLE_GAP apart."""
    import random

    outbox = Outbox(store)
    pauses = random.Random(count)
    committed: dict[str, float] = {}
    with psycopg.connect(store.require_dsn()) as conn:
        for number in range(count):
            time.sleep(pauses.uniform(*IDLE_GAP))
            message_id = outbox.write(
                conn, destination=destination, body=b"x" * 200, key=f"key-{number % 250}"
            )
            conn.commit()
            committed[str(message_id)] = time.time()
    Path(out).write_text(json.dumps(committed))


async def measure(
    store: StoreSettings, transport: Transport, arguments: argparse.Namespace
) -> None:
    clock = AckClock(transport)
    worker = Worker([store], transports={store.name: {"broker": clock}}, settings=WorkerSettings())
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await worker.started.wait()
    await asyncio.sleep(1)  # membership settled, lanes scheduled
    with tempfile.TemporaryDirectory() as folder:
        context = multiprocessing.get_context("spawn")
        idle = arguments.idle
        writers = 1 if idle else WRITERS
        processes = [
            context.Process(
                target=write_idly,
                args=(store, arguments.destination, idle, f"{folder}/0.json"),
            )
        ]
        if not idle:
            processes = [
                context.Process(
                    target=write_steadily,
                    args=(
                        store,
                        arguments.destination,
                        arguments.rate,
                        arguments.seconds,
                        f"{folder}/{index}.json",
                        index,
                    ),
                )
                for index in range(WRITERS)
            ]
        for process in processes:
            process.start()
        while any(process.is_alive() for process in processes):
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)  # the last rows' acknowledgements
        committed: dict[str, float] = {}
        for index in range(writers):
            text = await asyncio.to_thread(Path(f"{folder}/{index}.json").read_text)
            committed.update(json.loads(text))
    stop.set()
    await task
    stats = worker.stores[store.name].relay.stats
    first = min(committed.values())
    # Idle: the first row is left out (the writer's process opens its waker's connection for
    # it) and shown apart; steady: the first 2 s.
    warm_up = first + (0.001 if idle else 2.0)
    if idle:
        first_id = min(committed, key=committed.__getitem__)
        if first_id in clock.acked:
            print(
                f"the writer process's first row: {(clock.acked[first_id] - first) * 1000:.1f} "
                "ms (left out below: it opens the waker's connection)"
            )
    latencies = sorted(
        (clock.acked[message_id] - at) * 1000
        for message_id, at in committed.items()
        if at >= warm_up and message_id in clock.acked
    )
    missing = sum(1 for message_id in committed if message_id not in clock.acked)
    if idle:
        print(
            f"{len(committed):,} lone rows, each committed {IDLE_GAP[0]:g}-{IDLE_GAP[1]:g} s after "
            "the one before "
            f"(notify = {store.notify!r}), {missing} not acknowledged"
        )
    else:
        rate = len(committed) / arguments.seconds
        print(
            f"{len(committed):,} rows at {rate:,.0f} rows/s over {arguments.seconds:g} s "
            f"({WRITERS} writer connections, one row per transaction), {missing} not "
            "acknowledged"
        )
    quantiles = statistics.quantiles(latencies, n=100)
    print(
        f"{'idle to first delivery' if idle else 'commit-to-ack latency'} "
        f"({arguments.transport}): p50 {quantiles[49]:.2f} ms, "
        f"p90 {quantiles[89]:.2f} ms, p99 {quantiles[98]:.2f} ms, max {latencies[-1]:.2f} ms"
    )
    transactions = stats.batch_seconds.count
    print(
        f"{stats.batches:,} lane batches in {transactions:,} batch transactions "
        f"({stats.batches / max(transactions, 1):.1f} lanes per transaction), "
        f"{stats.sent / max(stats.batches, 1):.1f} rows per lane batch; scans: "
        + ", ".join(f"{count:,} {scan}" for scan, count in sorted(stats.by_scan.items()))
    )


async def main_async(arguments: argparse.Namespace) -> None:
    with postgres(arguments.dsn) as dsn:
        print(f"machine: {machine()}; {server_version(dsn)}")
        with scratch_schema(dsn, "latency") as schema_name:
            store = await applied(
                store_settings(
                    name="latency",
                    dsn=dsn,
                    schema=schema_name,
                    table_prefix="l_",
                    lanes=arguments.lanes,
                    transports={"broker": {"type": "memory"}},
                    default_transport="broker",
                    notify=arguments.notify,
                )
            )
            if arguments.transport == "kafka":
                await kafka_run(store, arguments)
            else:
                arguments.destination = "events"
                await measure(store, MemoryTransport("broker"), arguments)


async def kafka_run(store: StoreSettings, arguments: argparse.Namespace) -> None:
    from bench.transport_bare import create_topic, kafka_cluster
    from relayer.transports.kafka import KafkaTransport

    with kafka_cluster(arguments.kafka_bootstrap) as bootstrap:
        arguments.destination = create_topic(bootstrap)
        options: dict[str, Any] = {"bootstrap.servers": bootstrap}
        for option in arguments.kafka_option:
            name, _, value = option.partition("=")
            options[name] = value
        await measure(store, KafkaTransport("broker", options), arguments)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--transport", choices=("memory", "kafka"), default="memory")
    parser.add_argument("--lanes", type=int, default=64)
    parser.add_argument("--kafka-bootstrap", help="default: an embedded tansu broker")
    parser.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a librdkafka setting for the transport (repeatable), e.g. linger.ms=1",
    )
    parser.add_argument(
        "--notify", choices=("after_commit", "in_transaction", "off"), default="after_commit"
    )
    parser.add_argument(
        "--idle", type=int, default=0, metavar="N", help="idle to first delivery: N lone rows"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
