"""A chaos run: worker processes behind a PostgreSQL fault proxy, a steady writer, a broker,
and the database-side records the checker reads.

- Each ``relayer run orders`` worker gets a TOML file of its own whose DSN points at its own
  listener of one PostgreSQL proxy (``sslmode=disable``, so the proxy can read the protocol);
  a fault thereby knows which process sent a statement. A killed worker is replaced by a new
  process on the same slot, as a supervisor would.
- Through PgBouncer (``bouncer``): the proxy sits between the workers and PgBouncer in
  transaction mode, the workers' stores say ``pooler = "transaction"`` and the writer writes
  through PgBouncer too; the checker's reads stay direct.
- The writers are threads, each with its own connection and its own share of the keys (so
  each key's ids are in commit order), together writing ``rows_per_second``. Each
  transaction writes rows for random keys of its writer, bodies ``key#seq`` with a sequence
  number per key, and records the ids in the table ``chaos_written`` in the same transaction:
  the committed set is exactly that table, even when the writer lost its connection during a
  COMMIT. Two writers commit concurrently: a lane can send one's newer rows while the other's
  older ones are not committed yet (docs/storage.md#what-is-not-done-yet).
- The store is in either storage mode (docs/storage.md); triggers record each row leaving
  the pending set and whether the transaction that removed it held the lane's lease row (I5,
  see tests/chaos/audit.py and tests/chaos/checker.py). A partitioned store's partitions span
  a minute and its cleanup runs every few seconds, so rotation runs during the longer runs.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from relayer import Outbox, OutboxMessage, lane_for
from relayer.settings import StoreSettings
from relayer.settings.stores import Storage
from tests.acceptance.cli import command, environment
from tests.chaos.audit import (
    backlog,
    install_audit,
    read_audit,
    read_written,
    removals_of,
)
from tests.chaos.brokers import KafkaTarget
from tests.chaos.checker import Report
from tests.chaos.proxy import LoopThread, Proxy
from tests.conftest import apply_schema, make_store
from tests.contract.brokers import Received
from tests.pgbouncer import PgBouncer


@dataclass(frozen=True, slots=True)
class Settings:
    """Store settings of every chaos run: short leases so that takeovers happen in seconds."""

    lanes: int = 16
    batch_size: int = 50
    lease: float = 4.0
    poll: float = 0.5
    pool_size: int = 4
    retry_backoff: float = 0.5
    retry_backoff_max: float | None = None  # None: retry_backoff x 4
    max_attempts: int = 10
    keys: int = 200
    rows_per_second: int = 300  # of all writers together
    writers: int = 2
    rows_per_transaction: int = 10
    # Partitioned storage only: the shortest span, and a cleanup (which rotates the
    # partitions) every few seconds, so that partitions are dropped while the faults happen.
    partition_span: str = "1m"
    cleanup_interval: float = 5.0


class Target(Protocol):
    name: str
    destination: str
    # Whether read_all can be called again and reads everything again (a Kafka topic; a
    # RabbitMQ queue is emptied by its read).
    rereadable: bool

    def transport_toml(self) -> str: ...

    def read_all(self) -> list[Received]: ...


# Before a committed row the broker did not give back is counted lost, a topic is read once
# more, from its start, with a fresh consumer, this long after the first read ended.
REREAD_AFTER = 5.0


RECORDER = Path(__file__).parent / "recorder"  # the workers' delivery-report recorder


def recorder_env(folder: Path) -> dict[str, str]:
    """The environment that makes a worker record its Kafka delivery reports in ``folder``
    (tests/chaos/recorder/sitecustomize.py)."""
    path = os.pathsep.join(filter(None, [str(RECORDER), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "RELAYER_TEST_DELIVERIES_DIR": str(folder)}


def recorded_reports(
    folder: Path,
) -> Iterator[tuple[str, str, int | None, int | None, str]]:
    """Every delivery report the workers recorded in ``folder``: (worker pid, message id,
    partition, offset, outcome); None where the report had no partition or offset."""
    for path in sorted(folder.glob("deliveries-*.txt")):
        pid = path.stem.removeprefix("deliveries-")
        for line in path.read_text().splitlines():
            message_id, partition, offset, outcome = line.split(" ")
            yield pid, message_id, _number(partition), _number(offset), outcome


def _number(text: str) -> int | None:
    return None if text == "None" else int(text)


def unplaced_reports(folder: Path) -> int:
    """Reports of success without an offset (librdkafka's DUPLICATE_SEQUENCE_NUMBER answer):
    the relay does not trust them and sends their rows again
    (relayer.transports.kafka.placement)."""
    return sum(
        outcome == "ok" and offset is None for _, _, _, offset, outcome in recorded_reports(folder)
    )


def acknowledgements_of(
    folder: Path, ids: list[str], received: list[Received], read_errors: list[str]
) -> list[str]:
    """For rows the broker did not serve: the delivery reports the workers recorded for each
    (worker pid, partition, offset, outcome) and what the read found at that offset; then the
    offsets missing from each partition's read, and the consumer's errors."""
    reports: dict[str, list[tuple[str, int | None, int | None, str]]] = {row: [] for row in ids}
    for pid, message_id, partition, offset, outcome in recorded_reports(folder):
        if message_id in reports:
            reports[message_id].append((pid, partition, offset, outcome))
    at = {(item.partition, item.offset): item.message_id for item in received}
    found = []
    for row, seen in reports.items():
        if not seen:
            found.append(f"{row}: no delivery report recorded")
        for pid, partition, offset, outcome in seen:
            there = at.get((partition, offset), "nothing")
            found.append(
                f"{row}: worker {pid} got {outcome} at partition {partition} offset {offset}; "
                f"the read found {there} there"
            )
    offsets: dict[int, set[int]] = {}
    for item in received:
        if item.partition is not None and item.offset is not None:
            offsets.setdefault(item.partition, set()).add(item.offset)
    for partition, held in sorted(offsets.items()):
        gaps = sorted(set(range(max(held) + 1)) - held)  # a run's topic starts at offset 0
        if gaps:
            found.append(f"partition {partition}: offsets {gaps[:10]} not read ({len(gaps)})")
    return found + [f"consumer error: {error}" for error in read_errors[:5]]


def lost_account(lines: list[str], received: list[Received]) -> str:
    """The report of lost rows, then every message the read got (partition, offset, id)."""
    read = sorted(
        received, key=lambda item: (item.partition or 0, item.offset or 0, item.message_id)
    )
    return (
        "\n".join(
            [*lines, "", "read (partition offset id):"]
            + [f"{item.partition} {item.offset} {item.message_id}" for item in read]
        )
        + "\n"
    )


def live_members(store: StoreSettings) -> int:
    leases = store.names.table("leases")
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE lane IS NULL AND expires_at > now()").format(
                sql.Identifier(leases)
            )
        ).fetchone()
    assert row is not None
    return int(row[0])


class Writer(threading.Thread):
    """Writes its share of ``rows_per_second`` rows, for its share of the keys, until stopped;
    see the module docstring."""

    def __init__(
        self, store: StoreSettings, destination: str, settings: Settings, number: int = 0
    ) -> None:
        super().__init__(name=f"chaos-writer-{number}", daemon=True)
        self.number = number
        self.store = store
        # The application's own statements: behind a transaction pooler none is prepared.
        self.prepare_threshold = None if store.pooler == "transaction" else 5
        self.destination = destination
        self.settings = settings
        self.stopping = threading.Event()
        self.failures = 0
        self.commits = 0
        self._sequence: dict[str, int] = {}
        self._lanes: dict[str, int] = {}

    def run(self) -> None:
        rng = random.Random(7 + self.number)
        outbox = Outbox(self.store)
        share = self.settings.writers
        keys = [f"key-{n}" for n in range(self.settings.keys) if n % share == self.number]
        self._lanes = {key: lane_for(key, self.settings.lanes) for key in keys}
        pause = self.settings.rows_per_transaction * share / self.settings.rows_per_second
        conn: psycopg.Connection[Any] | None = None
        next_at = time.monotonic()
        while not self.stopping.is_set():
            next_at += pause
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(
                        self.store.require_dsn(),
                        connect_timeout=2,
                        prepare_threshold=self.prepare_threshold,
                    )
                self._write(conn, outbox, rng.choices(keys, k=self.settings.rows_per_transaction))
                self.commits += 1
            # ValueError: psycopg 3's COPY end unpacks one result, and a server connection
            # terminated mid-COPY behind PgBouncer answers with two (an error, then the
            # termination): the connection is lost all the same.
            except (psycopg.Error, ValueError):
                self.failures += 1
                if conn is not None:
                    conn.close()
                conn = None
                self.stopping.wait(0.2)
                next_at = time.monotonic()
            self.stopping.wait(max(next_at - time.monotonic(), 0))
        if conn is not None:
            conn.close()

    def _write(self, conn: psycopg.Connection[Any], outbox: Outbox, keys: list[str]) -> None:
        sequences = []
        for key in keys:
            self._sequence[key] = self._sequence.get(key, 0) + 1
            sequences.append(self._sequence[key])
        messages = [
            OutboxMessage(self.destination, f"{key}#{seq}".encode(), key=key)
            for key, seq in zip(keys, sequences, strict=True)
        ]
        ids = outbox.write_many(conn, messages)
        conn.execute(
            "INSERT INTO chaos_written (id, key, seq, lane) "
            "SELECT * FROM unnest(%s::uuid[], %s::text[], %s::int[], %s::int[])",
            (ids, keys, sequences, [self._lanes[key] for key in keys]),
        )
        conn.commit()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


class Workers:
    """``relayer run orders`` processes, one per slot, each through its own proxy port."""

    def __init__(
        self,
        folder: Path,
        config: Callable[[int], str],
        count: int,
        extra_env: Callable[[int], dict[str, str]] = lambda slot: {},
    ) -> None:
        self.folder = folder
        self.config = config
        self.extra_env = extra_env
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []  # every process's, in start order
        self.current_logs: dict[int, Path] = {}
        self.count = count

    def start(self) -> None:
        for slot in range(self.count):
            self.processes.append(self._spawn(slot))

    def _spawn(self, slot: int) -> subprocess.Popen[bytes]:
        path = self.folder / f"worker-{slot}.toml"
        path.write_text(self.config(slot))
        log = self.folder / f"worker-{slot}-{len(self.logs)}.log"
        self.logs.append(log)
        self.current_logs[slot] = log
        with log.open("wb") as sink:
            return subprocess.Popen(
                command("--config", str(path), "run", "orders"),
                env={**environment(), **self.extra_env(slot)},
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def pid(self, slot: int) -> int:
        return self.processes[slot].pid

    def signal(self, slot: int, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid(slot), signum)

    def replace(self, slot: int) -> None:
        """Start a new process on ``slot`` (after the old one was killed)."""
        old = self.processes[slot]
        old.wait(10)
        self.processes[slot] = self._spawn(slot)

    def assert_running(self) -> None:
        for slot, process in enumerate(self.processes):
            assert process.poll() is None, f"worker {slot} exited: {self.tail(slot)}"

    def tail(self, slot: int, lines: int = 30) -> str:
        return "\n".join(self.logs_of(slot).splitlines()[-lines:])

    def logs_of(self, slot: int) -> str:
        return self._log_text(self.current_logs[slot])

    def all_logs(self) -> str:
        return "\n".join(self._log_text(log) for log in self.logs)

    @staticmethod
    def _log_text(path: Path) -> str:
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_serving(self, timeout: float = 30) -> None:
        """Until every current process has logged that it serves (a replacement started late
        in a short run may still be importing, before its SIGTERM handler exists)."""
        deadline = time.monotonic() + timeout
        for slot in range(self.count):
            while "[action=start " not in self.logs_of(slot) and time.monotonic() < deadline:
                self.assert_running()
                time.sleep(0.1)

    def stop(self) -> list[int | None]:
        """SIGTERM every worker (SIGCONT first, in case one is stopped); SIGKILL after 30 s."""
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGCONT)
                    process.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for process in self.processes:
            try:
                codes.append(process.wait(30))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                codes.append(None)
        return codes


def worker_config(
    store: StoreSettings, dsn: str, settings: Settings, transport: str, pooler: str = "none"
) -> str:
    return f"""
[worker]
pool_size = {settings.pool_size}

[stores.orders]
dsn = "{dsn}"
pooler = "{pooler}"
table_prefix = "{store.table_prefix}"
{storage_toml(store, settings)}lanes = {settings.lanes}
lease_duration = "{settings.lease}s"
poll_interval = "{settings.poll}s"
batch_size = {settings.batch_size}
retry_backoff = "{settings.retry_backoff}s"
retry_backoff_max = "{settings.retry_backoff_max or settings.retry_backoff * 4}s"
max_attempts = {settings.max_attempts}
default_transport = "broker"

[stores.orders.transports.broker]
{transport}
"""


def storage_toml(store: StoreSettings, settings: Settings) -> str:
    if store.storage == "delete":
        return ""
    return (
        f'storage = "{store.storage}"\n'
        f'partition_span = "{settings.partition_span}"\n'
        f'cleanup_interval = "{settings.cleanup_interval}s"\n'
    )


def via_proxy(dsn: str, port: int) -> str:
    return make_conninfo(
        dsn, host="127.0.0.1", port=str(port), sslmode="disable", gssencmode="disable"
    )


def upstream_of(dsn: str) -> tuple[str, int] | str:
    """Where the PostgreSQL proxy connects: (host, port), or a Unix socket path."""
    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "/var/run/postgresql").split(",")[0]
    port = int(str(params.get("port") or 5432).split(",")[0])
    if host.startswith("/"):
        return f"{host}/.s.PGSQL.{port}"
    return (host, port)


class Run:
    """One chaos scenario from start to report; use as a context manager, then ``finish``."""

    def __init__(
        self,
        report: Report,
        dsn: str,
        folder: Path,
        loop: LoopThread,
        target: Target,
        settings: Settings,
        *,
        extra_env: Callable[[int], dict[str, str]] = lambda slot: {},
        bouncer: PgBouncer | None = None,
        storage: Storage = "delete",
    ) -> None:
        self.report = report
        self.settings = settings
        self.loop = loop
        self.target = target
        self.bouncer = bouncer
        modes: dict[str, str] = {"storage": storage}
        if storage == "partitioned":
            modes["partition_span"] = settings.partition_span
        # Direct: the schema, the audit, the checks.
        self.store = make_store(dsn, lanes=settings.lanes, **modes)
        relayed, pooler = (
            (dsn, "none") if bouncer is None else (bouncer.dsn_for(dsn), "transaction")
        )
        self.pg_proxy = loop.call(lambda: Proxy(upstream_of(relayed), protocol="postgres"))
        self.ports = [loop.run(self.pg_proxy.listen(slot)) for slot in range(report.workers)]
        self.folder = folder
        recording = recorder_env(folder) if isinstance(target, KafkaTarget) else {}
        self.workers = Workers(
            folder,
            lambda slot: worker_config(
                self.store,
                via_proxy(relayed, self.ports[slot]),
                settings,
                target.transport_toml(),
                pooler,
            ),
            report.workers,
            lambda slot: {**recording, **extra_env(slot)},
        )
        writes = make_store(relayed, lanes=settings.lanes, pooler=pooler, **modes)
        self.writers = [
            Writer(writes, target.destination, settings, number)
            for number in range(settings.writers)
        ]
        self.started = time.monotonic()

    def start(self) -> None:
        """Apply the schema and the audit, start the workers, wait until each is a member,
        start the writers."""
        self.loop.run(apply_schema(self.store))
        install_audit(self.store)
        self.workers.start()
        deadline = time.monotonic() + 30
        while live_members(self.store) < self.report.workers:
            self.workers.assert_running()
            assert time.monotonic() < deadline, "the workers did not join within 30 s"
            time.sleep(0.1)
        self.started = time.monotonic()
        for writer in self.writers:
            writer.start()

    def injected(self, count: int = 1) -> None:
        self.report.injections += count

    def finish(self, drain_seconds: float = 40) -> Report:
        """Stop the writers, wait until nothing is pending, stop the workers, read the broker,
        and compute the report (the caller asserts ``report.problems()`` is empty)."""
        from tests.chaos.checker import check

        for writer in self.writers:
            writer.stopping.set()
        for writer in self.writers:
            writer.stop()
        deadline = time.monotonic() + drain_seconds
        pending, parked = backlog(self.store, self.loop)
        while pending > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
            pending, parked = backlog(self.store, self.loop)
        self.report.pending, self.report.parked = pending, parked
        self.report.seconds = time.monotonic() - self.started
        self.workers.wait_serving()
        # A replacement still starting (importing, on a busy machine) when the SIGTERM below
        # comes would die of it before its handler is installed: let every process join first.
        deadline = time.monotonic() + 30
        while live_members(self.store) < self.report.workers and time.monotonic() < deadline:
            time.sleep(0.1)
        codes = self.workers.stop()
        logs = self.workers.all_logs()
        self.report.stale_rollbacks = logs.count("fenced delete matched") + logs.count(
            "fenced progress matched"
        )
        received = self.target.read_all()
        written = read_written(self.store)
        if self.target.rereadable:
            delivered = {uuid.UUID(message.message_id) for message in received}
            missed = sum(row not in delivered for row in written)
            if missed:
                # tansu has served acknowledged messages late (docs/chaos.md): a second whole
                # read, later, decides. What it still lacks is lost; the first read's shortfall
                # is reported either way.
                time.sleep(REREAD_AFTER)
                again = self.target.read_all()
                if len(again) >= len(received):
                    received = again
                self.report.first_read_missed = missed
        check(
            self.report,
            written,
            received,
            lanes=self.settings.lanes,
            timed_out_keys=_timed_out_keys(logs),
        )
        self.report.audit = read_audit(self.store)
        if self.report.lost:
            examples = list(self.report.lost_examples)  # ids only
            self.report.lost_examples += removals_of(self.store, examples)
            if isinstance(self.target, KafkaTarget):
                self.report.lost_examples += acknowledgements_of(
                    self.folder, examples, received, self.target.read_errors
                )
                self.report.lost_examples += [
                    f"broker: {line}" for line in self.target.broker_errors()[-10:]
                ]
                (self.folder / "broker.log").write_text(self.target.broker.output())
            # pytest cuts a long assertion message short: the whole account goes to a file.
            account = self.folder / "lost-report.txt"
            account.write_text(lost_account(self.report.lost_examples, received))
            print(f"{self.report.scenario}: the whole account of the lost rows: {account}")
        if isinstance(self.target, KafkaTarget):
            self.report.unplaced = unplaced_reports(self.folder)
        if self.report.unplaced:
            print(
                f"{self.report.scenario}: {self.report.unplaced} delivery reports of success "
                "came without an offset (DUPLICATE_SEQUENCE_NUMBER answers); their rows were "
                "not deleted on them and went again"
            )
        if self.report.first_read_missed:
            print(
                f"{self.report.scenario}: the first read of the topic missed "
                f"{self.report.first_read_missed} committed rows; {self.report.lost} were "
                f"still missing {REREAD_AFTER:g} s later"
            )
        self.report.unclean_exits = sum(code != 0 for code in codes)
        return self.report

    def close(self) -> None:
        for writer in self.writers:
            writer.stopping.set()
        with contextlib.suppress(Exception):
            self.workers.stop()
        with contextlib.suppress(Exception):
            self.loop.run(self.pg_proxy.close())


def _timed_out_keys(logs: str) -> set[str]:
    """Keys a worker parked with a Kafka message timeout (the documented inversion case)."""
    keys = set()
    for line in logs.splitlines():
        if "parked:" in line and "timed out" in line.lower() and "key '" in line:
            keys.add(line.split("key '", 1)[1].split("'", 1)[0])
    return keys


@contextlib.contextmanager
def running(run: Run) -> Iterator[Run]:
    try:
        run.start()
        yield run
    finally:
        run.close()
