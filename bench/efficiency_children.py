"""The processes bench/efficiency.py measures, each started as ``python THIS KIND JSON``.

- ``bare-kafka``, ``bare-kafka-steady``, ``bare-rabbitmq``, ``bare-nats``, ``bare-redis``,
  ``bare-webhooks``, ``bare-sqs``,
  ``floor``: set up, print
  ``{"ready": ...}``, wait for a line on stdin, do the measured work, print one JSON line with
  its own CPU seconds (main thread and whole process, ``time.thread_time`` /
  ``time.process_time``) around that work.
- ``worker``: relayer.worker.Worker as ``relayer run`` builds it from the same TOML file, with
  every transport wrapped in a SampledAckClock; on SIGTERM it stops gracefully and writes the
  sampled acknowledgement times to a file (steady mode's commit-to-ack latency).
- ``floor-steady``: the least relay at steady mode's rate (one blocking loop), until a second
  line on stdin; writes sampled acknowledgement times to a file.
- ``fenced-floor-steady``: the same on relayer's own statements (bench/fenced_floor.py).
- ``writer``: commits one outbox row per transaction at a steady rate over a few connections,
  and writes each row's commit time to a file.
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and `relayer` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import sql

from bench.cpu import is_local_postgres, thread_seconds
from bench.latency import AckClock
from bench.transport_bare import messages
from relayer.transports.base import OutgoingMessage, Transport
from relayer.transports.routing import PerMessage

KEYS = 10_000
# The steady writer: processes (so that a busy machine's scheduler gives it enough CPU) and
# connections in each (so that slow commits do not hold the rate back).
WRITER_PROCESSES = 2
WRITER_CONNECTIONS = 8
BARE_ACK_EVERY = 4  # the bare steady producer times one delivery in this many
FLOOR_BATCH = 500


def report(payload: dict[str, Any]) -> None:
    print(json.dumps(payload), flush=True)


def ready(**details: Any) -> None:
    """Tell the parent the set-up is done, and wait until it has read its counters."""
    report({"ready": details})
    sys.stdin.readline()


def clocks() -> tuple[float, float]:
    return time.thread_time(), time.process_time()


def spent(before: tuple[float, float], **extra: Any) -> dict[str, Any]:
    main, total = clocks()
    return {"main": main - before[0], "process": total - before[1], **extra}


# -- bare producers --------------------------------------------------------------------------


def bare_kafka(options: dict[str, Any]) -> None:
    from bench.transport_bare import kafka_producer, produce_all

    batch = messages(options["rows"], KEYS, options["topic"])
    producer = kafka_producer(options["bootstrap"], options["topic"])
    ready()
    started, before = time.perf_counter(), clocks()
    produce_all(producer, options["topic"], batch)
    report(spent(before, seconds=time.perf_counter() - started))


def bare_kafka_steady(options: dict[str, Any]) -> None:
    """bare-kafka at steady mode's rate: ``rate`` messages a second for ``seconds``, each
    produced on its own as one-row transactions bring them (or ``group`` at a time, every
    ``group`` / ``rate`` seconds, as a relay that gathers rows for that long sends them),
    delivery reports served while it waits for the next one."""
    from bench.transport_bare import BODY, kafka_producer

    topic = options["topic"]
    producer = kafka_producer(options["bootstrap"], topic)
    delivered = 0
    latencies: list[float] = []  # ms from produce() to its delivery report, 1 in BARE_ACK_EVERY

    def on_delivery(error: object, _message: object) -> None:
        nonlocal delivered
        delivered += error is None

    def timed(produced: float) -> Callable[[object, object], None]:
        def on_timed_delivery(error: object, message: object) -> None:
            on_delivery(error, message)
            if error is None:
                latencies.append((time.perf_counter() - produced) * 1000)

        return on_timed_delivery

    interval = 1 / options["rate"]
    group = options.get("group", 1)
    ready()
    started, before = time.perf_counter(), clocks()
    sent = 0
    while (elapsed := time.perf_counter() - started) < options["seconds"]:
        pause = sent * interval - elapsed
        if pause > 0:
            # poll() counts whole milliseconds: a shorter timeout is 0, which returns at once
            # and spun this loop (a core's worth of client CPU); a delivery report still ends
            # the wait as soon as it comes.
            producer.poll(max(pause, 0.001))
            continue
        for _ in range(group):
            headers = [("relayer-message-id", str(uuid.uuid4()))]
            key = f"key-{sent % KEYS}".encode()
            callback = on_delivery if sent % BARE_ACK_EVERY else timed(time.perf_counter())
            producer.produce(topic, BODY, key, headers=headers, on_delivery=callback)
            sent += 1
    producer.flush(30)
    result = spent(before, seconds=time.perf_counter() - started, rows=sent, delivered=delivered)
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else []
    report({**result, "timed": len(latencies), "quantiles": [quantiles[i] for i in (49, 89, 98)]})


async def bare_rabbitmq(options: dict[str, Any]) -> None:
    import aio_pika

    from bench.transport_bare import publish_all

    batch = messages(options["rows"], KEYS, "")
    connection = await aio_pika.connect(options["url"])
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await asyncio.to_thread(ready)
        started, before = time.perf_counter(), clocks()
        await publish_all(channel.default_exchange, options["queue"], batch)
        report(spent(before, seconds=time.perf_counter() - started))
    finally:
        await connection.close()


async def bare_queued(kind: str, options: dict[str, Any]) -> None:
    """bare-nats or bare-redis (bench/queued_brokers.py), from the same messages."""
    from bench.queued_brokers import add_redis, publish_nats

    batch = messages(options["rows"], KEYS, "")
    send = publish_nats if kind == "bare-nats" else add_redis
    await asyncio.to_thread(ready)
    started, before = time.perf_counter(), clocks()
    await send(options["url"], options["destination"], batch)
    report(spent(before, seconds=time.perf_counter() - started))


async def bare_http(kind: str, options: dict[str, Any]) -> None:
    """bare-webhooks or bare-sqs (bench/http_endpoints.py), from the same messages."""
    from bench.http_endpoints import post_webhooks, send_sqs

    batch = messages(options["rows"], KEYS, "")
    await asyncio.to_thread(ready)
    started, before = time.perf_counter(), clocks()
    if kind == "bare-webhooks":
        await post_webhooks(options["url"], options["secret"], options["destination"], batch)
    else:
        await send_sqs(options["endpoint_url"], options["destination"], batch)
    report(spent(before, seconds=time.perf_counter() - started))


# -- the least PostgreSQL work ---------------------------------------------------------------


def floor_connection(options: dict[str, Any]) -> psycopg.Connection[Any]:
    """The floor's connection: the relay's batch settings (no bitmap scans, asynchronous
    commit), every statement server-side prepared from its first run, and a lease row for
    every lane of the store in ``options``."""
    conn = psycopg.connect(
        options["dsn"],
        application_name="efficiency-floor",
        options="-c synchronous_commit=off -c enable_bitmapscan=off",
        prepare_threshold=0,
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (name, lane, owner, token, expires_at) "
            "SELECT 'lane:' || lane, lane, '', %s, 'infinity' "
            "FROM pg_catalog.generate_series(0, %s - 1) AS lane ON CONFLICT (name) DO NOTHING"
        ).format(sql.Identifier(options["schema"], options["leases"])),
        (uuid.uuid4(), options["lanes"]),
    )
    conn.commit()
    return conn


def floor(options: dict[str, Any]) -> None:
    """Per lane, in one transaction: lock its lease row, read up to 500 rows head first,
    delete them by an id array, commit; until every row is gone. The connection has the
    relay's batch settings (no bitmap scans, asynchronous commit)."""
    outbox = sql.Identifier(options["schema"], options["outbox"])
    leases = sql.Identifier(options["schema"], options["leases"])
    lock = sql.SQL("SELECT token FROM {} WHERE name = %s FOR UPDATE").format(leases)
    read = sql.SQL(
        "SELECT id, ordering_key, transport, destination, body, headers::text "
        "FROM {} WHERE lane = %s ORDER BY id LIMIT %s"
    ).format(outbox)
    delete = sql.SQL("DELETE FROM {} WHERE lane = %s AND id = ANY(%s)").format(outbox)
    with floor_connection(options) as conn:
        backend = conn.info.backend_pid
        ready(backend=backend)
        backend_before = thread_seconds(backend, backend)
        started, before = time.perf_counter(), clocks()
        deleted = 0
        lanes = list(range(options["lanes"]))
        while lanes:
            busy = []
            for lane in lanes:
                conn.execute(lock, (f"lane:{lane}",))
                ids = [row[0] for row in conn.execute(read, (lane, FLOOR_BATCH)).fetchall()]
                if ids:
                    deleted += conn.execute(delete, (lane, ids)).rowcount
                    busy.append(lane)
                conn.commit()
            lanes = busy
        backend_after = thread_seconds(backend, backend)
        backend_seconds = (
            None
            if backend_before is None or backend_after is None or not is_local_postgres(backend)
            else backend_after - backend_before
        )
        report(
            spent(
                before,
                seconds=time.perf_counter() - started,
                rows=deleted,
                backend=backend_seconds,
            )
        )


# -- the worker, with acknowledgement times --------------------------------------------------


class SampledAckClock(AckClock):
    """AckClock for one message in ``every``: the others pass through untouched, so the
    clock adds almost nothing to the worker's CPU. Any method the relay calls that this
    wrapper does not know goes to the transport unclocked."""

    def __init__(self, inner: Transport, every: int) -> None:
        super().__init__(inner)
        self.every = every
        self.seen = 0
        self.samples: list[tuple[object, float]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        acknowledgement = await self.inner.publish(message)
        self.seen += 1
        if self.seen % self.every:
            return acknowledgement
        future = asyncio.ensure_future(acknowledgement)
        message_id = message.id
        samples = self.samples

        def acknowledged(done: asyncio.Future[None]) -> None:
            if not done.cancelled() and done.exception() is None:
                samples.append((message_id, time.time()))

        future.add_done_callback(acknowledged)
        return future

    async def publish_batch(
        self,
        batch: Any,
        indexes: Sequence[int],
        settle: Callable[[int, BaseException | None], None],
        admitting: Callable[[], bool],
    ) -> int:
        """The relay's batch path: the acknowledgement of every ``every``-th row is timed."""
        if not self.batches:  # through publish(), sampled there
            return await PerMessage(self).publish_batch(batch, indexes, settle, admitting)
        every = self.every
        first = -self.seen % every  # the position in indexes of the next sampled row
        sampled = set(indexes[first::every])
        self.seen += len(indexes)
        if not sampled:
            return int(await self.inner.publish_batch(batch, indexes, settle, admitting))
        samples = self.samples
        ids = batch.ids

        def timed(index: int, error: BaseException | None) -> None:
            if error is None and index in sampled:
                samples.append((ids[index], time.time()))
            settle(index, error)

        return int(await self.inner.publish_batch(batch, indexes, timed, admitting))


def worker(options: dict[str, Any]) -> None:
    """The steady mode's worker: relayer.worker.Worker from the same TOML as ``relayer run``,
    in a process set up as ``relayer run`` sets up its own (logging, collector settings), its
    transports wrapped by SampledAckClock."""
    from relayer.cli.run_command import _tune_collector
    from relayer.observability.logs import configure
    from relayer.settings import load_settings
    from relayer.transports.registry import create_transports
    from relayer.worker import Worker

    settings = load_settings(options["config"])
    configure(settings.log_level, settings.log_format)
    store = settings.store(options["store"])
    wrapped = {
        name: SampledAckClock(transport, options["every"])
        for name, transport in create_transports(store).items()
    }
    relay = Worker(
        [store],
        transports={store.name: wrapped},
        settings=settings.worker,  # type: ignore[dict-item]
    )

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await relay.run(stop)

    _tune_collector()
    asyncio.run(serve())
    acked = {str(message_id): at for clock in wrapped.values() for message_id, at in clock.samples}
    published = sum(clock.seen for clock in wrapped.values())
    stats = relay.stores[store.name].relay.stats
    batching = {
        "transactions": stats.batch_seconds.count,
        "lane_batches": stats.batches,
        "sent": stats.sent,
    }
    Path(options["acks"]).write_text(
        json.dumps({"acked": acked, "published": published, "batching": batching})
    )


def floor_steady(options: dict[str, Any]) -> None:
    """The least a relay can do at steady mode's rate, as one blocking loop: wait for the
    writers' notifications, then in one transaction for every lane named since the last one:
    lock the lanes' lease rows, read their head rows (lane, id order), produce each to Kafka
    and wait for every delivery report, delete them by an id array, commit. No linger, no
    dispatch, no fencing, no second worker: what it costs and how soon the broker has a row is
    what this machine allows under the same writers. With ``tick`` (seconds) it listens for
    nothing and locks nothing: at every multiple of ``tick`` it reads every lane's rows, sends
    them and deletes them in one transaction (what gathering rows for a fixed time costs, at
    the least, against how late it makes them). Runs until a line arrives on stdin; writes the
    acknowledgement time of one row in ``every`` to ``acks``."""
    import select

    from bench.transport_bare import kafka_producer

    outbox = sql.Identifier(options["schema"], options["outbox"])
    leases = sql.Identifier(options["schema"], options["leases"])
    lock = sql.SQL("SELECT token FROM {} WHERE name = ANY(%s) FOR UPDATE").format(leases)
    read = sql.SQL(
        "SELECT id, ordering_key, destination, body FROM {} WHERE lane = ANY(%s) "
        "ORDER BY lane, id LIMIT %s"
    ).format(outbox)
    delete = sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(outbox)
    topic, every = options["topic"], options["every"]
    producer = kafka_producer(options["bootstrap"], topic)
    acked: dict[str, float] = {}
    delivered = 0

    def on_delivery(error: object, _message: object) -> None:
        nonlocal delivered
        delivered += error is None

    tick = float(options.get("tick", 0.0))
    every_lane = list(range(options["lanes"]))
    with (
        psycopg.connect(
            options["dsn"], autocommit=True, application_name="efficiency-floor-listen"
        ) as listen,
        floor_connection(options) as work,
    ):
        if not tick:
            listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(options["channel"])))
        pgconn = listen.pgconn
        ready(backends=[listen.info.backend_pid, work.info.backend_pid])
        started, before = time.perf_counter(), clocks()
        woken: set[int] = set()
        sent = transactions = 0
        while True:
            if tick:
                # Polled: no notification at all; every tick reads every lane's rows.
                wait = tick - (time.perf_counter() - started) % tick
                readable, _, _ = select.select([sys.stdin], [], [], wait)
                if sys.stdin in readable:
                    sys.stdin.readline()
                    break
                lanes = every_lane
                rows = work.execute(read, (lanes, FLOOR_BATCH)).fetchall()
            else:
                readable, _, _ = select.select([pgconn.socket, sys.stdin], [], [], 1.0)
                if sys.stdin in readable:
                    sys.stdin.readline()
                    break
                pgconn.consume_input()
                while (notice := pgconn.notifies()) is not None:
                    # A lane's number, or empty: every lane (a wake-up of many lanes).
                    woken.update([int(notice.extra)] if notice.extra else every_lane)
                if not woken:
                    continue
                lanes = sorted(woken)
                woken.clear()
                work.execute(lock, ([f"lane:{lane}" for lane in lanes],))
                rows = work.execute(read, (lanes, FLOOR_BATCH)).fetchall()
            for message_id, key, topic_name, body in rows:
                producer.produce(
                    topic_name,
                    body,
                    key,
                    headers=[("relayer-message-id", str(message_id))],
                    on_delivery=on_delivery,
                )
            producer.flush(30)
            now = time.time()
            for message_id, *_ in rows:
                sent += 1
                if sent % every == 0:
                    acked[str(message_id)] = now
            if rows:
                work.execute(delete, ([row[0] for row in rows],))
                transactions += 1
            work.commit()
        result = spent(before, seconds=time.perf_counter() - started, rows=sent)
    Path(options["acks"]).write_text(
        json.dumps({"acked": acked, "published": sent, "transactions": transactions})
    )
    report({**result, "delivered": delivered})


# -- the steady writer -----------------------------------------------------------------------


def writer(options: dict[str, Any]) -> None:
    """One writer process: WRITER_CONNECTIONS threads, each with a blocking connection
    committing one-row transactions on its turn. Blocking calls in threads, not asyncio: the
    writer is load, not what is measured, and an event loop per row cost it 2-4x the CPU, which
    it took from the relay on a two-core machine."""
    import threading

    from relayer import Outbox
    from relayer.settings import load_settings

    store = load_settings(options["config"]).store(options["store"])
    outbox = Outbox(store)
    first = options["process"] * WRITER_CONNECTIONS  # this process's first connection number
    everyone = WRITER_PROCESSES * WRITER_CONNECTIONS
    interval = everyone / options["rate"]  # options["rate"]: all processes together
    committed: dict[str, float] = {}
    connections = [
        psycopg.connect(store.require_dsn(), application_name=options["application_name"])
        for _ in range(WRITER_CONNECTIONS)
    ]
    backends = [conn.info.backend_pid for conn in connections]
    ready(backends=backends)
    started, before = time.perf_counter(), clocks()

    def write(conn: psycopg.Connection[Any], index: int) -> None:
        number = 0
        offset = index / everyone * interval  # the connections take turns
        while (elapsed := time.perf_counter() - started) < options["seconds"]:
            pause = offset + number * interval - elapsed
            if pause > 0:
                time.sleep(pause)
            message_id = outbox.write(
                conn,
                destination=options["destination"],
                body=b"x" * 200,
                key=f"key-{(number * everyone + index) % KEYS}",
            )
            conn.commit()
            committed[str(message_id)] = time.time()
            number += 1

    threads = [
        threading.Thread(target=write, args=(conn, index), name=f"writer-{index}")
        for index, conn in enumerate(connections, start=first)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = spent(before, seconds=time.perf_counter() - started, rows=len(committed))
    for conn in connections:
        conn.close()
    Path(options["out"]).write_text(json.dumps(committed))
    report(result)


def main() -> None:
    kind, options = sys.argv[1], json.loads(sys.argv[2])
    if kind == "bare-kafka":
        bare_kafka(options)
    elif kind == "bare-kafka-steady":
        bare_kafka_steady(options)
    elif kind == "bare-rabbitmq":
        asyncio.run(bare_rabbitmq(options))
    elif kind in ("bare-nats", "bare-redis"):
        asyncio.run(bare_queued(kind, options))
    elif kind in ("bare-webhooks", "bare-sqs"):
        asyncio.run(bare_http(kind, options))
    elif kind == "floor":
        floor(options)
    elif kind == "floor-steady":
        floor_steady(options)
    elif kind == "fenced-floor-steady":
        from bench.fenced_floor import fenced_floor_steady

        fenced_floor_steady(options, ready, spent, clocks)
    elif kind == "worker":
        worker(options)
    elif kind == "writer":
        writer(options)
    else:
        raise SystemExit(f"unknown kind {kind!r}")


if __name__ == "__main__":
    main()
