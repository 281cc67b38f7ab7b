"""NATS JetStream and Redis Streams for bench/efficiency.py: their destinations, their server
processes, and the bare clients it sets beside relayer's drains to them.

The bare NATS publisher (nats-py) publishes each message with its Nats-Msg-Id and a reply
subject, up to 1,000 acknowledgements outstanding, as JetStream's own async publishing does.
The bare Redis client (redis-py's asyncio client) sends XADDs in pipelines of 1,000. Both carry
the outbox id as relayer does (a header; a field) and wait for every answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from bench.cpu import find_processes
from relayer.transports.base import OutgoingMessage

WINDOW = 1_000


def nats_pids() -> list[int]:
    return find_processes("nats-server")


def redis_pids() -> list[int]:
    return find_processes("redis-server")


@contextlib.asynccontextmanager
async def nats_subject(url: str) -> AsyncIterator[str]:
    """A subject a JetStream stream of its own captures, deleted after."""
    import nats

    connection = await nats.connect(url)
    name = f"bench-{uuid.uuid4().hex[:12]}"
    subject = name.replace("-", "_") + ".events"
    try:
        await connection.jetstream().add_stream(name=name, subjects=[subject])
        try:
            yield subject
        finally:
            await connection.jetstream().delete_stream(name)
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def redis_stream(url: str) -> AsyncIterator[str]:
    """A stream's key, deleted after."""
    import redis.asyncio

    client: Any = redis.asyncio.Redis.from_url(url)
    name = f"bench-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        await client.delete(name)
        await client.aclose()


async def publish_nats(url: str, subject: str, batch: Sequence[OutgoingMessage]) -> None:
    """Publish ``batch`` with up to WINDOW acknowledgements outstanding; return when all
    are acknowledged."""
    import nats

    connection = await nats.connect(url)
    try:
        jetstream = connection.jetstream(publish_async_max_pending=WINDOW)
        window: list[asyncio.Future[Any]] = []
        for message in batch:
            headers = {"Nats-Msg-Id": message.id_text, "relayer-message-id": message.id_text}
            window.append(await jetstream.publish_async(subject, message.body, headers=headers))
            if len(window) >= WINDOW:
                await asyncio.gather(*window)
                window.clear()
        await asyncio.gather(*window)
    finally:
        await connection.close()


async def add_redis(url: str, stream: str, batch: Sequence[OutgoingMessage]) -> None:
    """XADD ``batch`` in pipelines of WINDOW; return when all are answered."""
    import redis.asyncio

    client: Any = redis.asyncio.Redis.from_url(url)
    try:
        for start in range(0, len(batch), WINDOW):
            pipeline = client.pipeline(transaction=False)
            for message in batch[start : start + WINDOW]:
                pipeline.xadd(stream, {"body": message.body, "relayer-message-id": message.id_text})
            await pipeline.execute()
    finally:
        await client.aclose()
