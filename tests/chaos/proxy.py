"""A TCP proxy for the chaos suite, on 127.0.0.1, between relay workers and PostgreSQL or a
broker: latency (a delay line, so traffic stays pipelined), stalls (connections stay open, no
byte moves), held replies (requests go through, answers wait), resets (RST on both sides)
and refusals of new connections.

Some faults must hit exact protocol points, without hooks in relayer's code, so the proxy reads
the protocols it carries:

- PostgreSQL (frontend and backend messages, ``sslmode=disable``): a ``watch`` sees every
  client message before it is forwarded and may hold it, drop it or act right after forwarding
  it. :class:`PostgresLink` remembers which prepared statement is the relay's outcome statement
  (psycopg prepares a statement after a few executions; later executions send only a Bind that
  names it), and the backend pid of each connection. NotificationResponse messages can be
  dropped: a lost NOTIFY.
- Kafka: the client id of a connection's first request, so that ``block`` can refuse the relay
  workers while a test reader still gets through.

One proxy can listen on several ports, each with a tag: the chaos harness gives each worker
process its own port, so a fault knows which process sent what.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from relayer.identifiers import StoreNames
from relayer.sql import queries_for

T = TypeVar("T")

# Text only the relay's outcome statement (relayer/sql/relay.sql, record_outcomes) contains.
OUTCOME_MARKER = b"WITH fence AS ("
assert OUTCOME_MARKER.decode() in queries_for(StoreNames.create("public", "x_"))["record_outcomes"]

_SSL_REQUEST = 80877103
_GSS_REQUEST = 80877104


class LoopThread:
    """An asyncio event loop in a daemon thread; the synchronous test code submits to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="chaos-loop")
        self._thread.daemon = True
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call(self, function: Callable[[], T]) -> T:
        async def call() -> T:
            return function()

        return self.run(call())

    def close(self) -> None:
        async def cancel_all() -> None:
            current = asyncio.current_task()
            tasks = [task for task in asyncio.all_tasks() if task is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.run(cancel_all(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one client message: forward it (or not), then maybe act at once."""

    forward: bool = True
    then: Callable[[], None] | None = None  # runs once the message was written upstream


FORWARD = Verdict()
DROP = Verdict(forward=False)


@dataclass(frozen=True, slots=True)
class ClientMessage:
    """One PostgreSQL message from the client, classified for watches."""

    kind: int  # the type byte (0: the startup message)
    raw: bytes
    outcome: bool  # executes the relay's outcome statement (the fenced delete)
    commit_after_outcome: bool  # COMMIT of a transaction that ran the outcome statement


@dataclass(slots=True)
class PostgresLink:
    """What the proxy knows about one PostgreSQL connection."""

    backend_pid: int | None = None
    prepared_outcomes: set[bytes] = field(default_factory=set)
    # The relay's outcome statement went through in the open transaction: a COMMIT follows.
    outcome_sent: bool = False


@dataclass(eq=False, slots=True)
class Link:
    """One proxied connection."""

    tag: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    hello: bytes = b""  # the client's first bytes
    upstream_port: int = 0  # the proxy's local port towards the server
    postgres: PostgresLink = field(default_factory=PostgresLink)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


Watch = Callable[[Link, ClientMessage], Awaitable[Verdict]]


class Proxy:
    """See the module docstring. Every method runs on the proxy's event loop."""

    def __init__(self, upstream: tuple[str, int] | str, *, protocol: str | None = None) -> None:
        """``upstream``: (host, port), or the path of a Unix socket. ``protocol``: None,
        ``"postgres"``, ``"kafka"`` or ``"nats"`` (whose server speaks first: the proxy
        connects upstream without waiting for the client's first bytes, and ``block`` cannot
        tell its clients apart)."""
        self.upstream = upstream
        self.protocol = protocol
        self.latency = 0.0
        self.watch: Watch | None = None
        self.drop_notifications = False
        self.dropped_notifications = 0
        self.refuse: Callable[[bytes], bool] | None = None
        self.links: set[Link] = set()
        self.servers: list[asyncio.Server] = []
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._replies = asyncio.Event()  # clear: the server's bytes are held (hold_replies)
        self._replies.set()

    async def listen(self, tag: int = 0, port: int = 0) -> int:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve(tag, reader, writer)

        server = await asyncio.start_server(serve, "127.0.0.1", port)
        self.servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    # -- faults ------------------------------------------------------------------------

    def stall(self) -> None:
        """Hold every byte in both directions until ``resume``; connections stay open."""
        self._flowing.clear()

    def hold_replies(self) -> None:
        """Hold every byte from the server until ``resume`` (requests still reach it): a reply
        lost on its way if the connection is reset meanwhile."""
        self._replies.clear()

    def resume(self) -> None:
        self._flowing.set()
        self._replies.set()

    def reset(self, which: Callable[[Link], bool] = lambda link: True) -> int:
        """Reset connections (RST to both peers); returns how many."""
        chosen = [link for link in self.links if which(link)]
        for link in chosen:
            self._abort(link)
        return len(chosen)

    def block(self, refuse: Callable[[bytes], bool]) -> int:
        """Reset the connections whose first bytes ``refuse`` matches and refuse such new
        ones (reset after their first bytes) until ``unblock``."""
        self.refuse = refuse
        return self.reset(lambda link: refuse(link.hello))

    def unblock(self) -> None:
        self.refuse = None

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        self.resume()
        self.reset()
        for server in self.servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)

    # -- plumbing ----------------------------------------------------------------------

    async def _serve(
        self, tag: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        link = Link(tag, writer)
        self.links.add(link)
        try:
            if self.protocol != "nats":
                link.hello = await reader.read(65536)
                if not link.hello or (self.refuse is not None and self.refuse(link.hello)):
                    self._abort(link)
                    return
            try:
                if isinstance(self.upstream, str):
                    up_reader, link.upstream = await asyncio.open_unix_connection(self.upstream)
                else:
                    up_reader, link.upstream = await asyncio.open_connection(*self.upstream)
            except OSError:
                self._abort(link)  # the server is down: the client sees a reset
                return
            peer = link.upstream.get_extra_info("sockname")
            link.upstream_port = int(peer[1]) if isinstance(peer, tuple) else 0
            transparent = self.protocol != "postgres" or _encrypted(link.hello)
            up = _Direction(self, link, link.upstream, client_side=True, parse=not transparent)
            down = _Direction(self, link, writer, client_side=False, parse=not transparent)
            link.tasks = [
                asyncio.ensure_future(up.pump(reader, first=link.hello)),
                asyncio.ensure_future(down.pump(up_reader, first=b"")),
            ]
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            self._abort(link)
            self.links.discard(link)

    def _abort(self, link: Link) -> None:
        for stream in (link.client, link.upstream):
            if stream is None or stream.transport.is_closing():
                continue
            sock = stream.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            stream.transport.abort()
        for task in link.tasks:
            if task is not asyncio.current_task():
                task.cancel()


class _Direction:
    """One direction of one link: read, look at messages, delay, write (in order)."""

    def __init__(
        self,
        proxy: Proxy,
        link: Link,
        sink: asyncio.StreamWriter,
        *,
        client_side: bool,
        parse: bool,
    ) -> None:
        self.proxy = proxy
        self.link = link
        self.sink = sink
        self.client_side = client_side
        self.frames = _PostgresFrames(startup=client_side) if parse else None
        self.queue: asyncio.Queue[tuple[float, bytes, Callable[[], None] | None] | None] = (
            asyncio.Queue()
        )

    async def pump(self, source: asyncio.StreamReader, first: bytes) -> None:
        writer = asyncio.ensure_future(self._write())
        try:
            data = first
            while True:
                if data:
                    await self._take(data)
                data = await source.read(65536)
                if not data:
                    break
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            await self.queue.put(None)
            with contextlib.suppress(Exception):
                await writer
            with contextlib.suppress(Exception):
                self.sink.close()

    async def _take(self, data: bytes) -> None:
        if self.frames is None:
            self._enqueue(data, None)
            return
        pending = bytearray()
        for kind, message in self.frames.feed(data):
            verdict = await self._judge(kind, message)
            if verdict.forward:
                pending += message
            if verdict.then is not None:
                self._enqueue(bytes(pending), verdict.then)
                pending.clear()
        if pending:
            self._enqueue(bytes(pending), None)

    async def _judge(self, kind: int, message: bytes) -> Verdict:
        link = self.link.postgres
        if not self.client_side:
            if kind == ord("K") and len(message) >= 9:
                link.backend_pid = struct.unpack("!i", message[5:9])[0]
            elif kind == ord("A") and self.proxy.drop_notifications:
                self.proxy.dropped_notifications += 1
                return DROP
            return FORWARD
        outcome = is_outcome_statement(link, kind, message)
        commit = is_commit(kind, message) and link.outcome_sent
        if outcome:
            link.outcome_sent = True
        elif kind == ord("Q") or ends_transaction(kind, message):
            link.outcome_sent = False  # COMMIT or ROLLBACK ends the transaction
        if self.proxy.watch is None:
            return FORWARD
        return await self.proxy.watch(self.link, ClientMessage(kind, message, outcome, commit))

    def _enqueue(self, data: bytes, then: Callable[[], None] | None) -> None:
        due = asyncio.get_running_loop().time() + self.proxy.latency
        self.queue.put_nowait((due, data, then))

    async def _write(self) -> None:
        loop = asyncio.get_running_loop()
        while (item := await self.queue.get()) is not None:
            due, data, then = item
            await self.proxy._flowing.wait()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            await self.proxy._flowing.wait()
            if not self.client_side:
                await self.proxy._replies.wait()
            if data:
                self.sink.write(data)
                await self.sink.drain()
            if then is not None:
                then()


class _PostgresFrames:
    """Splits a PostgreSQL byte stream into whole messages: (type byte, raw message); the
    type of the untyped startup message is 0."""

    def __init__(self, *, startup: bool) -> None:
        self.buffer = bytearray()
        self.startup = startup

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.buffer += data
        messages: list[tuple[int, bytes]] = []
        while True:
            if self.startup:
                if len(self.buffer) < 4:
                    break
                size = struct.unpack("!i", self.buffer[:4])[0]
                if len(self.buffer) < size:
                    break
                messages.append((0, bytes(self.buffer[:size])))
                del self.buffer[:size]
                self.startup = False
                continue
            if len(self.buffer) < 5:
                break
            size = struct.unpack("!i", self.buffer[1:5])[0] + 1
            if len(self.buffer) < size:
                break
            messages.append((self.buffer[0], bytes(self.buffer[:size])))
            del self.buffer[:size]
        return messages


def _encrypted(hello: bytes) -> bool:
    """An SSL or GSS encryption request: the proxy then passes bytes through unread."""
    if len(hello) < 8:
        return False
    code = struct.unpack("!i", hello[4:8])[0]
    return code in (_SSL_REQUEST, _GSS_REQUEST)


def _cstrings(message: bytes, count: int) -> list[bytes]:
    parts = message[5:].split(b"\0", count)
    return parts[:count]


def is_outcome_statement(link: PostgresLink, kind: int, message: bytes) -> bool:
    """Whether this client message executes the relay's outcome statement (the fenced delete).

    A Parse of the unnamed statement carries the text; a named Parse prepares it (the Bind
    that follows in the same flush executes it); a Bind naming it executes it again."""
    if kind == ord("P"):
        name, query = _cstrings(message, 2)
        if OUTCOME_MARKER not in query:
            return False
        if name:
            link.prepared_outcomes.add(name)
            return False
        return True
    if kind == ord("B"):
        _portal, statement = _cstrings(message, 2)
        return bool(statement) and statement in link.prepared_outcomes
    return False


def is_commit(kind: int, message: bytes) -> bool:
    """A COMMIT: a simple query (psycopg's commit()), or the Parse of an unnamed statement
    (the extended protocol of a pipeline, as relayer.store.wire sends it after the outcome
    statement, with its Bind, Execute and Sync in the same write)."""
    return _command(kind, message) == b"COMMIT"


def ends_transaction(kind: int, message: bytes) -> bool:
    return _command(kind, message) in (b"COMMIT", b"ROLLBACK")


def _command(kind: int, message: bytes) -> bytes | None:
    """The text of a simple query or of an unnamed Parse, upper-cased; None otherwise."""
    if kind == ord("Q"):
        return message[5:].rstrip(b"\0").strip().upper()
    if kind == ord("P"):
        name, query = _cstrings(message, 2)
        return None if name else query.strip().upper()
    return None


def kafka_client_id(hello: bytes) -> str | None:
    """The client id in the header of a Kafka request (size, api key, version, correlation
    id, then the client id as an INT16-length string), or None if ``hello`` is too short."""
    if len(hello) < 14:
        return None
    length = struct.unpack("!h", hello[12:14])[0]
    if length < 0 or len(hello) < 14 + length:
        return None
    return hello[14 : 14 + length].decode(errors="replace")
