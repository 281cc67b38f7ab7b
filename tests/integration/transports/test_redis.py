"""Redis Streams specifics on the real server: WRONGTYPE, MAXLEN, streams not created, a lost
connection, a stalled server, an unreachable one."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis.asyncio

from relayer.testing.pipeline import relay_messages
from relayer.transports import stalls
from relayer.transports.base import (
    DestinationError,
    OutgoingMessage,
    SendError,
    TransportUnavailableError,
)
from relayer.transports.redis import RedisTransport
from relayer.transports.routing import Fault, classify
from tests.chaos.proxy import Proxy
from tests.contract.brokers import read_stream, unique


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Any]:
    """A client of the test's own; the keys the test names in ``client.made`` are deleted."""
    connection: Any = redis.asyncio.Redis.from_url(redis_url)
    connection.made = []
    try:
        yield connection
    finally:
        if connection.made:
            await connection.delete(*connection.made)
        await connection.aclose()


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[Proxy]:
    parts = urlsplit(redis_url)
    through = Proxy((parts.hostname or "127.0.0.1", parts.port or 6379))
    await through.listen()
    try:
        yield through
    finally:
        await through.close()


def proxied_url(proxy: Proxy) -> str:
    return f"redis://127.0.0.1:{proxy.servers[0].sockets[0].getsockname()[1]}/0"


def stream_of(client: Any) -> str:
    name = unique("stream")
    client.made.append(name)
    return name


def message(stream: str, key: str = "k") -> OutgoingMessage:
    return OutgoingMessage(uuid.uuid4(), stream, b"body", key=key)


async def test_a_key_of_another_type_is_the_rows_fault(redis_url: str, client: Any) -> None:
    wrong = stream_of(client)
    await client.set(wrong, "a string")
    transport = RedisTransport("redis", redis_url)
    await transport.start()
    try:
        with pytest.raises(DestinationError, match="holds a string, not a stream"):
            await transport.ordered_by_key(wrong)
        with pytest.raises(SendError) as caught:
            await (await transport.publish(message(wrong)))
        verdict = classify(caught.value)
        assert (verdict.fault, verdict.permanent) == (Fault.ROW, True)
        assert wrong in verdict.text and "fix the destination" in verdict.text
    finally:
        await transport.close()


async def test_maxlen_trims_each_stream_about_to_that_length(redis_url: str, client: Any) -> None:
    stream = stream_of(client)
    transport = RedisTransport("redis", redis_url, maxlen=100)
    await transport.start()
    try:
        sent = [message(stream, f"k{n}") for n in range(2_000)]
        outcomes = await relay_messages(transport, sent)
        assert {item.outcome for item in outcomes} == {"acked"}
    finally:
        await transport.close()
    length = await client.xlen(stream)
    assert 100 <= length < 1_000  # MAXLEN ~: whole nodes are trimmed, never below 100
    newest = await read_stream(client, stream)
    assert newest[-1].message_id == str(sent[-1].id)


async def test_without_create_streams_a_missing_stream_parks_the_key(
    redis_url: str, client: Any
) -> None:
    missing = stream_of(client)
    transport = RedisTransport("redis", redis_url, create_streams=False)
    await transport.start()
    try:
        with pytest.raises(DestinationError, match="create_streams is false"):
            await transport.ordered_by_key(missing)
        with pytest.raises(SendError) as caught:
            await (await transport.publish(message(missing)))
        assert caught.value.retryable is False and "XGROUP CREATE" in str(caught.value)
        await client.xadd(missing, {"made": "by the operator"})
        assert await transport.ordered_by_key(missing) is True
        await (await transport.publish(message(missing)))
    finally:
        await transport.close()
    assert await client.xlen(missing) == 2


async def test_a_lost_connection_is_not_the_rows_fault(proxy: Proxy, client: Any) -> None:
    stream = stream_of(client)
    transport = RedisTransport("redis", proxied_url(proxy), socket_timeout=5.0)
    await transport.start()
    try:
        proxy.stall()
        waiting = [await transport.publish(message(stream, f"k{n}")) for n in range(20)]
        assert proxy.reset() > 0
        for acknowledgement in waiting:  # reset, or (not written yet) stalled: never answered
            with pytest.raises(TransportUnavailableError) as caught:
                await asyncio.wait_for(acknowledgement, 60)
            assert classify(caught.value).fault is Fault.BROKER
        proxy.resume()
        outcomes = await relay_messages(transport, [message(stream, f"k{n}") for n in range(20)])
        assert [item.outcome for item in outcomes] == ["acked"] * 20
    finally:
        await transport.close()


async def test_a_stalled_server_refuses_copies_says_so_once_and_times_out(
    proxy: Proxy,
    client: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stalls, "QUIET_SECONDS", 0.0)  # any refusal tells of the stall
    stream = stream_of(client)
    transport = RedisTransport("redis", proxied_url(proxy), socket_timeout=1.0)
    await transport.start()
    caplog.set_level(logging.INFO, "relayer.transports.redis")
    try:
        first = message(stream)
        proxy.stall()
        acknowledgement = await transport.publish(first)
        for _ in range(3):
            with pytest.raises(TransportUnavailableError, match="earlier copy"):
                await (await transport.publish(first))
        said = [r for r in caplog.records if getattr(r, "action", "") == "transport_stall"]
        assert len(said) == 1 and "no attempt is counted" in said[0].getMessage()
        with pytest.raises(TransportUnavailableError) as caught:
            await asyncio.wait_for(acknowledgement, 30)  # socket_timeout: not the row's fault
        assert classify(caught.value).fault is Fault.BROKER
    finally:
        proxy.resume()
        await transport.close()


async def test_close_is_bounded_while_the_server_does_not_answer(proxy: Proxy, client: Any) -> None:
    stream = stream_of(client)
    transport = RedisTransport("redis", proxied_url(proxy))
    await transport.start()
    try:
        proxy.stall()
        late = await transport.publish(message(stream))
        started = time.monotonic()
        await transport.close_within(0.2)
        assert time.monotonic() - started < 10  # generous: a busy machine
        with pytest.raises(TransportUnavailableError, match="closed before"):
            await late
    finally:
        proxy.resume()
        await transport.close()


async def test_an_unreachable_server_is_a_clear_unavailable_error_without_the_password() -> None:
    transport = RedisTransport("redis", "redis://relayer:hunter2@127.0.0.1:9/0", connect_timeout=2)
    with pytest.raises(TransportUnavailableError) as caught:
        await transport.start()
    text = str(caught.value)
    assert "cannot connect Redis transport 'redis'" in text and "127.0.0.1:9" in text
    assert "hunter2" not in text and "hunter2" not in repr(transport)
