"""Webhooks and SQS for bench/efficiency.py: a webhook receiver and moto's SQS server, each in a
process of its own (their CPU is the broker's column), their destinations, and the bare clients
it sets beside relayer's drains to them.

The bare webhook client (httpx) posts each message signed as relayer signs it (HMAC-SHA256 of
``id.timestamp.body``, the same headers), up to 50 requests at once over as many connections
(the transport's default ``max_concurrency``). The bare SQS client (aiobotocore) sends
``SendMessageBatch`` requests of 10 messages with their group and deduplication ids, up to 100
requests outstanding (the transport's default 1,000 messages). Both wait for every answer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from relayer.transports.base import OutgoingMessage

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = 50
SQS_REQUESTS = 100
SQS_OPTIONS = {"region": "us-east-1", "access_key_id": "bench", "secret_access_key": "bench"}


@contextlib.asynccontextmanager
async def _server(module: str, *arguments: str) -> AsyncIterator[tuple[int, int]]:
    """``python -m module``, which prints its port and serves until its stdin closes: (port,
    pid)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *arguments,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    assert process.stdout is not None
    port = (await process.stdout.readline()).decode().strip()
    try:
        if not port.isdigit():
            raise RuntimeError(f"{module} did not start (it printed {port!r})")
        yield int(port), process.pid
    finally:
        process.kill()
        await process.wait()


@contextlib.asynccontextmanager
async def webhook_receiver() -> AsyncIterator[tuple[str, str, int]]:
    """A receiver (tests/webhook_receiver.py): (url, secret, pid)."""
    secret = "whsec_" + base64.b64encode(uuid.uuid4().bytes * 2).decode()
    async with _server("tests.webhook_receiver", secret) as (port, pid):
        yield f"http://127.0.0.1:{port}", secret, pid


@contextlib.asynccontextmanager
async def sqs_server() -> AsyncIterator[tuple[str, int]]:
    """moto's SQS server (tests/sqs_server.py): (endpoint, pid)."""
    async with _server("tests.sqs_server") as (port, pid):
        yield f"http://127.0.0.1:{port}", pid


def _client(endpoint: str) -> Any:
    from aiobotocore.config import AioConfig
    from aiobotocore.session import get_session

    return get_session().create_client(
        "sqs",
        region_name=SQS_OPTIONS["region"],
        endpoint_url=endpoint,
        aws_access_key_id=SQS_OPTIONS["access_key_id"],
        aws_secret_access_key=SQS_OPTIONS["secret_access_key"],
        config=AioConfig(max_pool_connections=SQS_REQUESTS),
    )


@contextlib.asynccontextmanager
async def sqs_queue(endpoint: str) -> AsyncIterator[str]:
    """A FIFO queue of its own, deleted after."""
    name = f"bench-{uuid.uuid4().hex[:12]}.fifo"
    async with _client(endpoint) as client:
        url = (await client.create_queue(QueueName=name, Attributes={"FifoQueue": "true"}))[
            "QueueUrl"
        ]
        try:
            yield name
        finally:
            await client.delete_queue(QueueUrl=url)


async def post_webhooks(
    url: str, secret: str, destination: str, batch: Sequence[OutgoingMessage]
) -> None:
    """POST each message of ``batch``, signed, CONCURRENCY at once; every answer a 2xx."""
    import httpx

    key = base64.b64decode(secret.removeprefix("whsec_"))
    room = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(limits=limits, trust_env=False) as client:

        async def post(message: OutgoingMessage) -> None:
            async with room:
                stamp = str(int(time.time()))
                signed = f"{message.id_text}.{stamp}.".encode() + message.body
                signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest())
                headers = {
                    "content-type": "application/json",
                    "webhook-id": message.id_text,
                    "webhook-timestamp": stamp,
                    "webhook-signature": "v1," + signature.decode(),
                    "idempotency-key": message.id_text,
                    "relayer-message-id": message.id_text,
                }
                answer = await client.post(
                    f"{url}/{destination}", content=message.body, headers=headers
                )
                answer.raise_for_status()

        await asyncio.gather(*(post(message) for message in batch))


async def send_sqs(endpoint: str, queue: str, batch: Sequence[OutgoingMessage]) -> None:
    """SendMessageBatch ``batch`` in tens, SQS_REQUESTS requests at once; none may fail."""
    room = asyncio.Semaphore(SQS_REQUESTS)
    async with _client(endpoint) as client:
        url = (await client.get_queue_url(QueueName=queue))["QueueUrl"]

        async def send(part: Sequence[OutgoingMessage]) -> None:
            entries = [
                {
                    "Id": str(number),
                    "MessageBody": message.body.decode(),
                    "MessageGroupId": message.key or message.id_text,
                    "MessageDeduplicationId": message.id_text,
                    "MessageAttributes": {
                        "relayer-message-id": {"DataType": "String", "StringValue": message.id_text}
                    },
                }
                for number, message in enumerate(part)
            ]
            async with room:
                answer = await client.send_message_batch(QueueUrl=url, Entries=entries)
            assert not answer.get("Failed"), answer["Failed"]

        await asyncio.gather(
            *(send(batch[start : start + 10]) for start in range(0, len(batch), 10))
        )
