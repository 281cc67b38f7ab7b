"""Probe cost with 65,536 lanes, and what an idle worker owning them all costs.

    python bench/probe.py [--lanes 65536] [--busy-lanes 655]

(1) times one probe of every lane (the read-only query a worker runs each poll_interval and on
an empty notification), with rows in ``--busy-lanes`` lanes; (2) runs one worker owning every
lane for 10 s with nothing to send and reports its CPU time and how many probe queries it ran.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from bench.common import machine, postgres, scratch_schema, server_version
from bench.relay import applied
from relayer import Outbox, OutboxMessage, lane_for
from relayer.relay.probes import Prober
from relayer.settings import StoreSettings, WorkerSettings, store_settings
from relayer.store import RelayStore
from relayer.transports.memory import MemoryTransport
from relayer.worker import Worker


def keys_for(lanes: int, busy: int) -> list[str]:
    """One key in each of ``busy`` lanes spread over the range."""
    wanted = {lane * (lanes // busy) for lane in range(busy)}
    keys: list[str] = []
    number = 0
    while wanted:
        key = f"key-{number}"
        lane = lane_for(key, lanes)
        if lane in wanted:
            wanted.discard(lane)
            keys.append(key)
        number += 1
    return keys


async def probe_cost(store: StoreSettings, busy: int) -> list[float]:
    async def connect() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True)

    prober = Prober(RelayStore(store), connect)
    timings = []
    for _ in range(6):
        started = time.perf_counter()
        heads = await prober.heads(0, 1)  # a lone member's share: every lane
        timings.append(time.perf_counter() - started)
        assert len(heads) == busy, (len(heads), busy)
    await prober.close()
    return timings[1:]  # the first also plans and caches


async def idle_worker(store: StoreSettings, seconds: float) -> tuple[float, int]:
    worker = Worker(
        [store], transports={store.name: {"broker": MemoryTransport("broker")}},
        settings=WorkerSettings(),
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await worker.started.wait()
    await asyncio.sleep(3)  # the first probe and the busy lanes' scans
    runtime = worker.stores[store.name]
    before = resource.getrusage(resource.RUSAGE_SELF)
    queries = runtime.relay.prober.queries
    await asyncio.sleep(seconds)
    after = resource.getrusage(resource.RUSAGE_SELF)
    probes = runtime.relay.prober.queries - queries
    stop.set()
    await task
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, probes


async def main_async(arguments: argparse.Namespace) -> None:
    with postgres(arguments.dsn) as dsn:
        print(f"machine: {machine()}; {server_version(dsn)}")
        with scratch_schema(dsn, "probe") as schema_name:
            store = await applied(
                store_settings(
                    name="probe",
                    dsn=dsn,
                    schema=schema_name,
                    table_prefix="p_",
                    lanes=arguments.lanes,
                    transports={"broker": {"type": "memory"}},
                    default_transport="broker",
                )
            )
            keys = keys_for(arguments.lanes, arguments.busy_lanes)
            with psycopg.connect(dsn) as conn:
                Outbox(store).write_many(conn, [OutboxMessage("e", b"x", key=k) for k in keys])
                conn.commit()
            timings = await probe_cost(store, len(keys))
            print(
                f"probe of {arguments.lanes:,} lanes ({len(keys):,} with rows): median "
                f"{statistics.median(timings) * 1000:,.1f} ms, max {max(timings) * 1000:,.1f} ms "
                "(one query)"
            )
            cpu, probes = await idle_worker(store, arguments.seconds)
            print(
                f"idle worker owning {arguments.lanes:,} lanes for {arguments.seconds:g} s: "
                f"{cpu:.2f} s CPU ({cpu / arguments.seconds:.0%} of a core), {probes} probe queries"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn")
    parser.add_argument("--lanes", type=int, default=65_536)
    parser.add_argument("--busy-lanes", type=int, default=655)
    parser.add_argument("--seconds", type=float, default=10)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
