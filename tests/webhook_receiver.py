"""A webhook receiver for the tests: an HTTP/1.1 server (h11 over asyncio) on a loopback port,
in a thread of its own, that records each request and checks its Standard Webhooks signature
with its own code (not relayer's).

By default it answers 200, 404 for a path with ``missing`` in it, and the status a request's
``x-test-status`` header asks for. ``answer`` replaces that rule (a coroutine: it may take its
time, for a slow endpoint). Requests answered with a 2xx are ``delivered``, in the order of
their answers; the others ``refused``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import h11

from relayer.transports.base import ORDERING_KEY_HEADER
from tests.contract.brokers import Received


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the receiver got it (header names in lower case, values as UTF-8)."""

    path: str
    headers: dict[str, str]
    body: bytes
    signed: bool  # webhook-signature matches the body, id and timestamp

    def received(self) -> Received:
        return Received(self.body, self.headers, self.headers.get(ORDERING_KEY_HEADER))


Answer = Callable[[Request], Awaitable[int]]


def new_secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


async def usual_answer(request: Request) -> int:
    if "missing" in request.path:
        return 404
    return int(request.headers.get("x-test-status", "200"))


class Receiver:
    """See the module docstring. ``start`` it; ``url`` is its base URL."""

    def __init__(self, secret: str | None = None, answer: Answer = usual_answer) -> None:
        self.secret = secret or new_secret()
        self._key = base64.b64decode(self.secret.removeprefix("whsec_"))
        self.answer = answer
        self.body: str | None = None  # what every answer says (None: its status and path)
        self.delivered: list[Request] = []
        self.refused: list[tuple[int, Request]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="webhook-receiver")
        self._thread.daemon = True
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def received(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [
                request.received()
                for request in self.delivered
                if path is None or request.path == path
            ]

    def wait_for(self, count: int, path: str | None = None, seconds: float = 30) -> list[Received]:
        """What was delivered (to ``path``), once at least ``count`` requests were, or after
        ``seconds``."""
        deadline = time.monotonic() + seconds
        while len(found := self.received(path)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return found

    def _signed(self, headers: dict[str, str], body: bytes) -> bool:
        identifier = headers.get("webhook-id", "")
        timestamp = headers.get("webhook-timestamp", "")
        content = f"{identifier}.{timestamp}.".encode() + body
        expected = base64.b64encode(hmac.new(self._key, content, hashlib.sha256).digest())
        given = headers.get("webhook-signature", "").encode()
        return any(hmac.compare_digest(b"v1," + expected, part) for part in given.split(b" "))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._read(connection, reader)
                if request is None:
                    return
                status = await self.answer(request)
                with self._lock:
                    if 200 <= status < 300:
                        self.delivered.append(request)
                    else:
                        self.refused.append((status, request))
                payload = (self.body or f"status {status} for {request.path}").encode()
                length = str(len(payload)).encode()
                writer.write(
                    connection.send(
                        h11.Response(status_code=status, headers=[(b"content-length", length)])
                    )
                )
                writer.write(connection.send(h11.Data(data=payload)))
                writer.write(connection.send(h11.EndOfMessage()))
                await writer.drain()
                if connection.our_state is h11.MUST_CLOSE:
                    return
                connection.start_next_cycle()
        except (h11.ProtocolError, ConnectionError):
            return
        finally:
            writer.close()

    async def _read(
        self, connection: h11.Connection, reader: asyncio.StreamReader
    ) -> Request | None:
        target = b""
        headers: dict[str, str] = {}
        body = bytearray()
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await reader.read(65_536))
            elif isinstance(event, h11.Request):
                target = event.target
                headers = {name.decode(): value.decode() for name, value in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                body_bytes = bytes(body)
                return Request(
                    target.decode(), headers, body_bytes, self._signed(headers, body_bytes)
                )
            else:  # ConnectionClosed, PAUSED
                return None


def main() -> None:
    """``python -m tests.webhook_receiver SECRET``: a receiver in a process of its own (the
    benchmarks measure its CPU); prints its port, serves until its stdin closes."""
    receiver = Receiver(secret=sys.argv[1]).start()
    print(receiver.port, flush=True)
    sys.stdin.read()
    receiver.stop()


if __name__ == "__main__":
    main()
