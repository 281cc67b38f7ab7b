"""The fenced least relay: the least a relay that keeps relayer's protocol can do at steady
mode's rate (bench/efficiency.py --steady), as one blocking loop on relayer's own statements.

At every multiple of ``tick`` (seconds), with no notification:

1. ``probe`` (optional): the store's probe of a member's whole share (relayer's
   ``probe_share``: a loose index scan over the lanes that hold rows, each head checked against
   the parked keys) tells which lanes have a row to send; without it, the tick goes on with
   every lane;
2. ``claim`` (optional): one call of the store's claim function for its queue on a connection of
   its own, as the dispatch gate makes before each batch (pause flags and concurrency limits);
3. in one round trip, BEGIN, ``lock_lanes`` (the lanes' leases, taken or kept, rows locked) and
   ``read_batch`` (their head rows, parked keys skipped);
4. every row produced to Kafka, then a wait for every delivery report;
5. ``record_outcomes`` (the fenced delete, every lane's lease token checked) with the COMMIT, in
   one round trip.

No dispatch queue, no event loop, no linger, no second member: what relayer's statements cost
a message at this rate when nothing else runs around them. relayer's own CPU over this shows
what its machinery (dispatch, schedule, pipeline, asyncio) adds; this over the polled least
relay (no lock, no fence: efficiency_children.floor_steady) shows what the protocol costs.

Run as ``python bench/efficiency_children.py fenced-floor-steady JSON``; until a second line on
stdin; writes the sampled acknowledgement times to ``acks``.
"""

from __future__ import annotations

import json
import select
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

from relayer.dispatch.control import queue_lock_key
from relayer.settings import load_settings
from relayer.sql import queries_for
from relayer.store.relay import lane_bits


def connect(dsn: str, name: str, *, autocommit: bool) -> psycopg.Connection[Any]:
    """A connection with the relay's batch settings, every statement prepared from its first
    run (as relayer's batch connections)."""
    return psycopg.connect(
        dsn,
        application_name=name,
        autocommit=autocommit,
        options="-c synchronous_commit=off -c enable_bitmapscan=off",
        prepare_threshold=0,
    )


def fenced_floor_steady(options: dict[str, Any], ready: Any, spent: Any, clocks: Any) -> None:
    from bench.transport_bare import kafka_producer

    settings = load_settings(options["config"])
    store = settings.store(options["store"])
    queries = queries_for(store.names)
    member = f"fenced-floor-{uuid.uuid4().hex[:8]}"
    token = uuid.uuid4()
    lease = store.lease_duration
    lanes = store.lanes
    every_lane = ",".join(str(lane) for lane in range(lanes))
    tick = float(options["tick"])
    probe, claim = bool(options["probe"]), bool(options["claim"])
    key = queue_lock_key(store.names, store.name)
    topic, every = options["topic"], options["every"]
    producer = kafka_producer(options["bootstrap"], topic)
    acked: dict[str, float] = {}
    delivered = 0

    def on_delivery(error: object, _message: object) -> None:
        nonlocal delivered
        delivered += error is None

    claim_params = {
        "queues": json.dumps([store.name]),
        "keys": str(key),
        "wanted": "1",
        "budget": 1,
        "held_keys": "",
        "held_slots": "",
        "release_keys": "",
        "release_slots": "",
    }
    with (
        connect(options["dsn"], "fenced-floor-probe", autocommit=True) as looker,
        connect(options["dsn"], "fenced-floor-dispatch", autocommit=True) as dispatcher,
        connect(options["dsn"], "fenced-floor", autocommit=False) as work,
    ):
        looker.execute(queries["ensure_lane_rows"], {"lanes": lanes})
        ready(
            backends=[
                looker.info.backend_pid,
                dispatcher.info.backend_pid,
                work.info.backend_pid,
            ]
        )
        started, before = time.perf_counter(), clocks()
        sent = transactions = claims = probes = 0
        while True:
            wait = tick - (time.perf_counter() - started) % tick
            readable, _, _ = select.select([sys.stdin], [], [], wait)
            if sys.stdin in readable:
                sys.stdin.readline()
                break
            named = every_lane
            if probe:
                probes += 1
                heads = looker.execute(
                    queries["probe_share"],
                    {"rank": 0, "members": 1, "skip": lane_bits(()), "first": 0, "end": lanes},
                ).fetchall()
                busy = [str(head[0]) for head in heads if head[1] and not head[2]]
                if not busy:
                    continue
                named = ",".join(busy)
            if claim:
                claims += 1
                granted = dispatcher.execute(queries["queue_claim"], claim_params).fetchall()
                if not any(row[3] == "granted" for row in granted):
                    continue
            params = {
                "lanes": named,
                "member": member,
                "token": token,
                "lease": lease,
                "limit": store.batch_size,
            }
            with work.pipeline():
                locked = work.execute(queries["lock_lanes"], params)
                read = work.execute(queries["read_batch"], params, binary=True)
            tokens = dict(locked.fetchall())
            rows = read.fetchall()
            if not rows:
                work.commit()
                continue
            for _lane, message_id, key_text, _transport, destination, body, _h, _f in rows:
                producer.produce(
                    destination,
                    body,
                    key_text,
                    headers=[("relayer-message-id", message_id)],
                    on_delivery=on_delivery,
                )
            producer.flush(30)
            now = time.time()
            for row in rows:
                sent += 1
                if sent % every == 0:
                    acked[row[1]] = now
            record(work, queries, tokens, rows, member, store)
            transactions += 1
        result = spent(before, seconds=time.perf_counter() - started, rows=sent)
    Path(options["acks"]).write_text(
        json.dumps(
            {
                "acked": acked,
                "published": sent,
                "transactions": transactions,
                "claims": claims,
                "probes": probes,
            }
        )
    )
    print(json.dumps({**result, "delivered": delivered}), flush=True)


def record(
    work: psycopg.Connection[Any],
    queries: Any,
    tokens: dict[int, str],
    rows: list[Any],
    member: str,
    store: Any,
) -> None:
    """The fenced delete of every row read, with the COMMIT, in one round trip."""
    locked = sorted(tokens)
    params = {
        "lanes": ",".join(str(lane) for lane in locked),
        "lane_count": len(locked),
        "tokens": ",".join(tokens[lane] for lane in locked),
        "member": member,
        "acked_lanes": ",".join(str(row[0]) for row in rows),
        "acked": ",".join(row[1] for row in rows),
        "failures": "[]",
        "max_attempts": store.max_attempts,
        "backoff": store.retry_backoff,
        "backoff_max": store.retry_backoff_max or timedelta(hours=1),
        "expected": len(rows),
    }
    with work.pipeline():
        work.execute(queries["record_outcomes"], params)
        work.commit()
