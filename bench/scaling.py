"""Throughput with 1, 2 and 4 worker processes, and the time to drain a large backlog.

    python bench/scaling.py --transport kafka [--rows 100000] [--workers 1 2 4]
    python bench/scaling.py --transport rabbitmq --rows 20000
    python bench/scaling.py --transport kafka --rows 1000000 --workers 2    # backlog drain

For each worker count: fill the outbox with ``--rows`` rows (200-byte bodies, 10,000 keys, 64
lanes), start that many ``relayer run`` processes, and time until the outbox is empty (the
processes' start-up included). Kafka is an embedded tansu broker unless a bootstrap server is
given; RabbitMQ is the loopback server. Prints rows/s; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, postgres, scratch_schema, server_version
from bench.relay import LANES, applied, fill, make_store, pending
from relayer.settings import StoreSettings


def config(store: StoreSettings, transport: dict[str, Any], folder: str) -> str:
    lines = [
        "[worker]",
        "pool_size = 20",
        "[stores.bench]",
        f'dsn = "{store.require_dsn()}"',
        f'schema = "{store.db_schema}"',
        f'table_prefix = "{store.table_prefix}"',
        f"lanes = {store.lanes}",
        f"notify = {str(store.notify).lower()}",
        'default_transport = "broker"',
        "[stores.bench.transports.broker]",
        *(f'"{name}" = "{value}"' for name, value in transport.items()),
    ]
    path = Path(folder) / "relayer.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


async def drain(store: StoreSettings, config_file: str, workers: int) -> float:
    command = [sys.executable, "-m", "relayer", "--config", config_file, "run", "bench"]
    env = {key: value for key, value in os.environ.items() if not key.startswith("RELAYER_")}
    env["PYTHONFAULTHANDLER"] = "1"
    started = time.perf_counter()
    processes = [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(workers)
    ]
    try:
        while await pending(store):
            for process in processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a worker exited: {process.stderr.read().decode()[-500:]}")
            await asyncio.sleep(0.1)
        return time.perf_counter() - started
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
                _, stderr = process.communicate(30)
                print(f"a worker did not stop within 60 s:\n{stderr.decode()[-4000:]}")


async def measure(
    dsn: str, transport: dict[str, Any], destination: str, arguments: argparse.Namespace
) -> None:
    for workers in arguments.workers:
        with scratch_schema(dsn, "scaling") as schema_name, tempfile.TemporaryDirectory() as d:
            store = await applied(make_store(dsn, schema_name, transport))
            started = time.perf_counter()
            await fill(store, arguments.rows, destination)
            filled = time.perf_counter() - started
            seconds = await drain(store, config(store, transport, d), workers)
            print(
                f"{arguments.transport}: {workers} worker(s) drained {arguments.rows:,} rows in "
                f"{seconds:,.1f} s: {arguments.rows / seconds:>8,.0f} rows/s "
                f"(filled in {filled:,.1f} s; {LANES} lanes, start-up included)"
            )


async def main_async(arguments: argparse.Namespace) -> None:
    with postgres(arguments.dsn) as dsn:
        print(f"machine: {machine()}; {server_version(dsn)}")
        if arguments.transport == "kafka":
            from bench.transport_bare import create_topic, kafka_cluster

            with kafka_cluster(arguments.kafka_bootstrap) as bootstrap:
                topic = create_topic(bootstrap)
                options = {"type": "kafka", "bootstrap.servers": bootstrap}
                await measure(dsn, options, topic, arguments)
        else:
            from bench.transport_bare import with_queue

            async def run(queue: str) -> float:
                options = {"type": "rabbitmq", "url": arguments.rabbitmq_url}
                await measure(dsn, options, "/" + queue, arguments)
                return 0.0

            await with_queue(arguments.rabbitmq_url, run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--transport", choices=("kafka", "rabbitmq"), default="kafka")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--kafka-bootstrap", help="default: an embedded tansu broker")
    parser.add_argument("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672/")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
