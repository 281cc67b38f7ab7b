"""One metrics scrape of a worker that owns many lanes: its size, lines and time, and how long
``/healthz`` takes to answer while the scrape is being produced.

    python bench/metrics_scrape.py [--lanes 65536] [--backlog] [--scrapes 5] [--dsn DSN]
                                   [-- EXTRA RUN ARGUMENTS]

The worker is the real CLI (``relayer --config FILE run bench --metrics-port PORT``) on an
empty store with ``--lanes`` lanes (memory transport). With ``--backlog`` every lane gets a row
first and the store's queue is paused, so every lane stays pending. Once the worker owns every
lane and its backlog gauges were refreshed, this process scrapes ``/metrics`` ``--scrapes``
times; during each scrape another thread asks ``/healthz`` every 5 ms and keeps the slowest
answer. Extra arguments after ``--`` go to ``relayer run``. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import sql

from bench.common import machine, postgres, scratch_schema, server_version
from bench.efficiency_processes import child_environment, write_config
from bench.relay import applied, make_store
from relayer.dispatch.control import QueueControl
from relayer.embedded import free_port
from relayer.settings import StoreSettings


def get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as response:
        body: bytes = response.read()
    return body


def value(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_until_ready(port: int, lanes: int, interval: float) -> None:
    """Until the worker owns every lane, then two more refresh intervals for the gauges."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if value(get(port, "/metrics").decode(), "relayer_owned_lanes") == lanes:
                time.sleep(2 * interval + 1)
                return
        time.sleep(0.5)
    raise SystemExit("the worker never owned every lane")


def one_scrape(port: int) -> tuple[int, int, float, float, int]:
    """(bytes, lines, scrape seconds, slowest /healthz seconds during it, /healthz answers)."""
    done = threading.Event()
    slowest = [0.0]
    answers = [0]

    def probe() -> None:
        while not done.is_set():
            started = time.perf_counter()
            get(port, "/healthz")
            slowest[0] = max(slowest[0], time.perf_counter() - started)
            answers[0] += 1
            done.wait(0.005)

    prober = threading.Thread(target=probe)
    started = time.perf_counter()
    prober.start()
    body = get(port, "/metrics")
    elapsed = time.perf_counter() - started
    done.set()
    prober.join()
    return len(body), body.count(b"\n"), elapsed, slowest[0], answers[0]


async def backlog(store: StoreSettings) -> None:
    """One row in every lane (the lane column set directly: a row per lane, no key search),
    with the store's queue paused so they stay."""
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        await QueueControl(conn, store.names).pause(store.name, by="bench")
        await conn.execute(
            sql.SQL(
                "INSERT INTO {}.{} (id, lane, ordering_key, destination, body) "
                "SELECT gen_random_uuid(), lane, 'key-' || lane, 'events', '\\x00' "
                "FROM generate_series(0, %s - 1) AS lane"
            ).format(sql.Identifier(store.db_schema), sql.Identifier(store.names.table("outbox"))),
            [store.lanes],
        )


@contextlib.contextmanager
def worker(config: str, port: int, extra: list[str]) -> Iterator[None]:
    command = [sys.executable, "-m", "relayer", "--config", config, "run", "bench"]
    command += ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"]
    command += ["--metrics-interval", "1", *extra]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stderr=log, env=child_environment())
        try:
            yield
        finally:
            process.terminate()
            if process.wait(timeout=120) != 0:
                log.seek(0)
                sys.stderr.write(log.read().decode(errors="replace")[-3000:])


async def run(arguments: argparse.Namespace) -> None:
    with postgres(arguments.dsn) as dsn, scratch_schema(dsn, "metrics") as schema_name:
        print(f"machine: {machine()}; {server_version(dsn)}")
        store = await applied(make_store(dsn, schema_name, lanes=arguments.lanes))
        if arguments.backlog:
            await backlog(store)
        with tempfile.TemporaryDirectory() as folder:
            config = write_config(store, {"type": "memory"}, folder)
            port = free_port()
            with worker(config, port, arguments.extra):
                await asyncio.to_thread(wait_until_ready, port, arguments.lanes, 1)
                results = [
                    await asyncio.to_thread(one_scrape, port) for _ in range(arguments.scrapes)
                ]
    size, lines = results[-1][0], results[-1][1]
    times = [result[2] for result in results]
    healthz = [result[3] for result in results]
    what = "one row in every lane, queue paused" if arguments.backlog else "empty outbox"
    print(f"lanes {arguments.lanes:,} ({what}), {arguments.scrapes} scrapes")
    print(f"  scrape: {size:,} bytes, {lines:,} lines")
    print(f"  scrape time: median {statistics.median(times):.3f} s, max {max(times):.3f} s")
    print(
        f"  /healthz during a scrape: slowest median {statistics.median(healthz):.3f} s, "
        f"max {max(healthz):.3f} s ({sum(result[4] for result in results)} answers)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--lanes", type=int, default=65_536)
    parser.add_argument("--backlog", action="store_true")
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="arguments for relayer run (after --)")
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
