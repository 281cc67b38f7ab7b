"""Soak: a worker process relaying a steady stream for a long time; its memory over time.

    python bench/soak_memory.py [--minutes 30] [--rate 300] [--notify]

Starts ``relayer run`` (one worker, Kafka on an embedded tansu broker unless
``--kafka-bootstrap`` is given), writes ``--rate`` rows/s (one row per transaction, 1,000
keys) for ``--minutes`` and samples the worker's resident memory (VmRSS) every minute. With
``--notify`` each commit wakes the worker by NOTIFY; without it the worker finds the rows by
its poll. Prints the samples and the growth between minute 5 and the last minute. Asserts
nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncio

import psycopg

from bench.common import machine, postgres, scratch_schema, server_version
from bench.relay import applied, make_store
from bench.scaling import config
from relayer import Outbox


def resident_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def soak(dsn: str, bootstrap: str, topic: str, arguments: argparse.Namespace) -> None:
    with scratch_schema(dsn, "soak") as schema_name, tempfile.TemporaryDirectory() as folder:
        options = {"type": "kafka", "bootstrap.servers": bootstrap}
        store = asyncio.run(applied(make_store(dsn, schema_name, options, notify=arguments.notify)))
        env = {key: value for key, value in os.environ.items() if not key.startswith("RELAYER_")}
        worker = subprocess.Popen(
            [sys.executable, "-m", "relayer", "--config", config(store, options, folder),
             "run", "bench"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        outbox = Outbox(store)
        samples: list[tuple[int, int]] = []
        try:
            with psycopg.connect(dsn) as conn:
                started = time.perf_counter()
                written = 0
                next_sample = 0.0
                while (elapsed := time.perf_counter() - started) < arguments.minutes * 60:
                    if elapsed >= next_sample:
                        minute = round(elapsed / 60)
                        samples.append((minute, resident_kib(worker.pid)))
                        print(f"minute {minute:>3}: worker RSS {samples[-1][1] / 1024:7.1f} MiB, "
                              f"{written:,} rows written", flush=True)  # fmt: skip
                        next_sample += 60
                    pause = written / arguments.rate - elapsed
                    if pause > 0:
                        time.sleep(pause)
                    outbox.write(
                        conn, destination=topic, body=b"x" * 200, key=f"key-{written % 1000}"
                    )
                    conn.commit()
                    written += 1
                samples.append((arguments.minutes, resident_kib(worker.pid)))
                pending = conn.execute(
                    psycopg.sql.SQL("SELECT count(*) FROM {}").format(
                        psycopg.sql.Identifier(store.db_schema, store.names.table("outbox"))
                    )
                ).fetchone()
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(60)
        at_five = next((rss for minute, rss in samples if minute >= 5), samples[0][1])
        last = samples[-1][1]
        print(
            f"worker RSS: minute 5 {at_five / 1024:.1f} MiB, minute {arguments.minutes} "
            f"{last / 1024:.1f} MiB: growth {(last - at_five) / at_five:+.1%}; "
            f"{written:,} rows written, {pending[0] if pending else '?'} pending at the end"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=float, default=300)
    parser.add_argument("--kafka-bootstrap", help="default: an embedded tansu broker")
    parser.add_argument(
        "--notify",
        action="store_true",
        help="the writer notifies and the worker listens (default: the worker finds rows by "
        "its poll, every poll_interval)",
    )
    arguments = parser.parse_args()
    from bench.transport_bare import create_topic, kafka_cluster

    with postgres(arguments.dsn) as dsn, kafka_cluster(arguments.kafka_bootstrap) as bootstrap:
        print(f"machine: {machine()}; {server_version(dsn)}")
        soak(dsn, bootstrap, create_topic(bootstrap), arguments)


if __name__ == "__main__":
    main()
