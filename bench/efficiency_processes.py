"""What bench/efficiency.py runs and follows: the worker process, the measured children, the
brokers' processes and the worker's PostgreSQL sessions."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg

from bench.cpu import find_processes
from bench.relay import DrainWatch
from relayer.settings import StoreSettings
from relayer.store import wire

CHILDREN = Path(__file__).resolve().parent / "efficiency_children.py"


# -- the environment of one run ----------------------------------------------------------------


@dataclass
class Environment:
    dsn: str
    arguments: argparse.Namespace
    bootstrap: str | None = None
    broker_pids: dict[str, list[int]] = field(default_factory=dict)
    # webhooks: url and secret of the receiver; sqs: the endpoint and credentials.
    http: dict[str, dict[str, str]] = field(default_factory=dict)


def tansu_pids(bootstrap: str) -> list[int]:
    port = bootstrap.rsplit(":", 1)[-1]
    return find_processes("tansu", f"127.0.0.1:{port}")


def rabbitmq_pids() -> list[int]:
    return find_processes("beam.smp", "rabbit")


@contextlib.asynccontextmanager
async def rabbitmq_queue(url: str) -> AsyncIterator[str]:
    import aio_pika

    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(f"bench-{uuid.uuid4().hex[:12]}", durable=True)
        try:
            yield queue.name
        finally:
            await queue.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()


def transport_options(environment: Environment, transport: str) -> dict[str, Any]:
    if transport == "kafka":
        return {"type": "kafka", "bootstrap.servers": environment.bootstrap}
    if transport == "rabbitmq":
        return {"type": "rabbitmq", "url": environment.arguments.rabbitmq_url}
    if transport == "nats":
        return {"type": "nats", "url": environment.arguments.nats_url}
    if transport == "redis":
        return {"type": "redis", "url": environment.arguments.redis_url}
    if transport in ("webhooks", "sqs"):
        return {"type": transport, **environment.http[transport]}
    return {"type": "memory"}


@contextlib.asynccontextmanager
async def destination(environment: Environment, transport: str) -> AsyncIterator[str]:
    if transport == "kafka":
        from bench.transport_bare import create_topic

        assert environment.bootstrap is not None
        yield await asyncio.to_thread(create_topic, environment.bootstrap)
    elif transport == "rabbitmq":
        async with rabbitmq_queue(environment.arguments.rabbitmq_url) as queue:
            yield "/" + queue
    elif transport == "nats":
        from bench.queued_brokers import nats_subject

        async with nats_subject(environment.arguments.nats_url) as subject:
            yield subject
    elif transport == "redis":
        from bench.queued_brokers import redis_stream

        async with redis_stream(environment.arguments.redis_url) as stream:
            yield stream
    elif transport == "sqs":
        from bench.http_endpoints import sqs_queue

        async with sqs_queue(environment.http["sqs"]["endpoint_url"]) as queue:
            yield queue
    else:
        yield "events"


def write_config(
    store: StoreSettings,
    transport: dict[str, Any],
    folder: str,
    store_options: Sequence[str] = (),
) -> str:
    """The worker's TOML: the store and its transport only, every other setting its default
    unless ``store_options`` (``name = value`` lines of TOML, from --store-option) set it."""
    lines = [
        f'[stores."{store.name}"]',
        f'dsn = "{store.require_dsn()}"',
        f'schema = "{store.db_schema}"',
        f'table_prefix = "{store.table_prefix}"',
        f"lanes = {store.lanes}",
        'default_transport = "broker"',
        *store_options,
        f'[stores."{store.name}".transports.broker]',
        *(f'"{name}" = "{value}"' for name, value in transport.items()),
    ]
    path = Path(folder) / "relayer.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# -- processes ------------------------------------------------------------------------------


def child_environment() -> dict[str, str]:
    """The caller's environment without its relayer settings (the config file says them all),
    but with the switch to psycopg's cursors, to measure that path too."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("RELAYER_") or key == wire.FORCE_VARIABLE
    }
    env["PYTHONFAULTHANDLER"] = "1"
    return env


class Callgrind:
    """Counts the instructions one process executes in a window: the process runs under
    valgrind's callgrind with instrumentation off (``prefix``), ``begin`` zeroes the counts and
    turns it on, ``end`` dumps and turns it off, and returns the instructions (every thread of
    the process) since ``begin``. Instruction counts do not depend on what else the machine is
    doing, so two runs of the same code at the same rate give the same figure within about 1%
    where CPU seconds move 2x; the process runs about 50x slower meanwhile, so keep the rate low
    (--steady-rate 20)."""

    TOOLS = ("valgrind", "callgrind_control")

    def __init__(self, folder: str, name: str) -> None:
        self.out = Path(folder) / f"callgrind.{name}"

    @classmethod
    def missing(cls) -> list[str]:
        """The tools it needs that are not on PATH."""
        return [tool for tool in cls.TOOLS if shutil.which(tool) is None]

    def prefix(self) -> list[str]:
        return [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={self.out}",
        ]

    async def begin(self, pid: int) -> None:
        await self._control("--zero", pid)
        await self._control("--instr=on", pid)

    async def end(self, pid: int) -> int:
        before = set(self.out.parent.glob(f"{self.out.name}.*"))
        await self._control("--dump=window", pid)
        await self._control("--instr=off", pid)
        dumps = sorted(set(self.out.parent.glob(f"{self.out.name}.*")) - before)
        if not dumps:
            raise RuntimeError(f"callgrind wrote no dump for process {pid}")
        for line in dumps[-1].read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"no instruction total in {dumps[-1].name}")

    @staticmethod
    async def _control(option: str, pid: int) -> None:
        result = await asyncio.to_thread(
            subprocess.run,
            ["callgrind_control", option, str(pid)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        said = (result.stdout + result.stderr).strip()
        # It exits 0 when it finds no such process, and says "Error: ..." instead.
        if result.returncode != 0 or said.startswith("Error") or "\nError" in said:
            said = said[-500:]
            raise RuntimeError(f"callgrind_control {option} {pid} failed: {said}")


class WorkerProcess:
    """A worker in a process of its own, its log in a file; ready once it logs "serving"
    (within ``start_within`` seconds)."""

    def __init__(
        self,
        command: list[str],
        folder: str,
        *,
        start_within: float = 60,
        env: dict[str, str] | None = None,
    ) -> None:
        self.command = command
        self.start_within = start_within
        self.env = env  # added to child_environment()
        self.log = Path(folder) / "worker.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""

    def check(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"the worker exited ({self.process.returncode}):\n{self.tail()}")

    async def __aenter__(self) -> WorkerProcess:
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                self.command,
                env={**child_environment(), **(self.env or {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + self.start_within
        while " serving " not in self.tail():
            self.check()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the worker did not serve within {self.start_within:g} s:\n{self.tail()}"
                )
            await asyncio.sleep(0.05)
        return self

    async def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, 60)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack
            await asyncio.to_thread(process.wait, 30)
            print(f"the worker did not stop within 60 s:\n{self.tail()}")

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def cli_worker(config: str, store: StoreSettings, folder: str) -> WorkerProcess:
    command = [sys.executable, "-m", "relayer", "--config", config, "run", store.name]
    return WorkerProcess(command, folder)


class Child:
    """A child of efficiency_children.py: set up, ready, go, one JSON result."""

    def __init__(self, kind: str, options: dict[str, Any], *, prefix: Sequence[str] = ()) -> None:
        self.kind = kind
        self.options = options
        self.prefix = list(prefix)  # a command the child runs under (valgrind: Callgrind)
        self.process: asyncio.subprocess.Process | None = None
        # Its log (librdkafka's configuration warnings, say) is shown only if it fails.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115

    async def start(self) -> dict[str, Any]:
        self.process = await asyncio.create_subprocess_exec(
            *self.prefix,
            sys.executable,
            str(CHILDREN),
            self.kind,
            json.dumps(self.options),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self.log,
            env=child_environment(),
        )
        return (await self._line())["ready"]  # type: ignore[no-any-return]

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def go(self) -> None:
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        await self.process.stdin.drain()

    async def result(self) -> dict[str, Any]:
        assert self.process is not None
        line = await self._line()
        await self.process.wait()
        self.log.close()
        return line

    async def _line(self) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        text = await self.process.stdout.readline()
        if not text:
            await self.process.wait()
            self.log.seek(0)
            output = self.log.read().decode(errors="replace")[-3000:]
            raise RuntimeError(f"{self.kind} child exited ({self.process.returncode}):\n{output}")
        return json.loads(text)  # type: ignore[no-any-return]


def backends_of(
    conn: psycopg.AsyncConnection[Any], store: str
) -> Callable[[], Awaitable[list[int]]]:
    """The pids of the worker's PostgreSQL sessions: application_name relayer:...STORE...
    (the store's name is unique to the run, so other users' relayer sessions never match)."""
    query = (
        "SELECT pid FROM pg_catalog.pg_stat_activity "
        "WHERE application_name LIKE 'relayer:%%' "
        "AND pg_catalog.strpos(application_name, %s) > 0"
    )

    async def pids() -> list[int]:
        cursor = await conn.execute(query, (f":{store}",))
        return [int(row[0]) for row in await cursor.fetchall()]

    return pids


class Relaying(Protocol):
    """A process that relays a store's rows: ``check()`` raises once it has exited."""

    def check(self) -> None: ...


async def drained(
    conn: psycopg.AsyncConnection[Any], store: StoreSettings, worker: Relaying
) -> None:
    """Return once ``store``'s outbox is empty (raise if the worker exits first). Every row
    must have been committed before the call (a DrainWatch)."""
    watch = DrainWatch(store)
    while not await watch.empty(conn):
        worker.check()
        await asyncio.sleep(0.02)
