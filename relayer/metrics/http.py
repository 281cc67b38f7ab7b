"""The metrics port's HTTP/1.1: ``/metrics``, ``/healthz`` and ``/readyz``, one request per
connection, answered on the worker's event loop (the render of ``/metrics`` is not: see
relayer.metrics.exporter)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

# A client that has not sent its request, or read the answer, within this many seconds is
# dropped (the render in between has no such bound: its thread runs it to the end anyway).
READ_WITHIN = 10


async def answer(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    scrape: Callable[[], Awaitable[bytes]],
    readiness: Callable[[], tuple[bool, str]],
) -> None:
    """A minimal HTTP/1.1 exchange: one request, one response, then close."""
    from prometheus_client import CONTENT_TYPE_LATEST

    try:
        async with asyncio.timeout(READ_WITHIN):
            request = (await reader.readline()).split()
            while (await reader.readline()).strip():
                pass  # request headers: nothing in them changes the answer
        method, path = [*request, b"", b""][:2]
        path = path.split(b"?")[0]
        if method not in (b"GET", b"HEAD"):
            status, body, kind = b"405 Method Not Allowed", b"", "text/plain"
        elif path in (b"/metrics", b"/"):
            status, body, kind = b"200 OK", await scrape(), CONTENT_TYPE_LATEST
        elif path == b"/healthz":
            # Answered from the worker's own event loop: an answer means it is alive.
            status, body, kind = b"200 OK", b"ok\n", "text/plain"
        elif path == b"/readyz":
            ready, reason = readiness()
            status = b"200 OK" if ready else b"503 Service Unavailable"
            body, kind = reason.encode() + b"\n", "text/plain"
        else:
            status, body, kind = (
                b"404 Not Found",
                b"see /metrics, /healthz or /readyz\n",
                "text/plain",
            )
        head = (
            b"HTTP/1.1 " + status + b"\r\nContent-Type: " + kind.encode()
            + b"\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
        )  # fmt: skip
        async with asyncio.timeout(READ_WITHIN):
            writer.write(head if method == b"HEAD" else head + body)
            await writer.drain()
    except (TimeoutError, OSError):
        pass  # the scraper went away; nothing to tell it
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
