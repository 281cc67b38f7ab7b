"""NATS JetStream specifics on the real server: deduplication, a missing stream, a lost
connection, a stalled server, an unreachable one."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import nats
import pytest

from relayer.testing.pipeline import relay_messages
from relayer.transports import stalls
from relayer.transports.base import OutgoingMessage, SendError, TransportUnavailableError
from relayer.transports.nats import NatsTransport
from relayer.transports.routing import Fault, classify
from tests.chaos.proxy import Proxy
from tests.contract.brokers import consume_nats, unique
from tests.services import answers, unavailable


@pytest.fixture
async def stream(nats_url: str) -> AsyncIterator[tuple[Any, str]]:
    """A connection of the test's own and a subject a fresh stream captures."""
    connection = await nats.connect(nats_url)
    name = unique("stream")
    subject = name.replace("-", "_") + ".events"
    await connection.jetstream().add_stream(name=name, subjects=[subject])
    try:
        yield connection, subject
    finally:
        await connection.jetstream().delete_stream(name)
        await connection.close()


@pytest.fixture
async def proxy(nats_url: str) -> AsyncIterator[Proxy]:
    parts = urlsplit(nats_url)
    through = Proxy((parts.hostname or "127.0.0.1", parts.port or 4222), protocol="nats")
    await through.listen()
    try:
        yield through
    finally:
        await through.close()


def proxied_url(proxy: Proxy) -> str:
    return f"nats://127.0.0.1:{proxy.servers[0].sockets[0].getsockname()[1]}"


def message(subject: str, key: str = "k", message_id: uuid.UUID | None = None) -> OutgoingMessage:
    return OutgoingMessage(message_id or uuid.uuid4(), subject, b"body", key=key)


def connected(transport: NatsTransport) -> bool:
    connection = transport._connection
    return connection is not None and connection.is_connected


async def wait_for(condition: Any, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.05)


async def test_a_copy_of_an_acknowledged_message_is_stored_once(
    nats_url: str, stream: tuple[Any, str]
) -> None:
    connection, subject = stream
    transport = NatsTransport("nats", nats_url)
    await transport.start()
    try:
        first = message(subject)
        again = message(subject, message_id=first.id)
        for copy in (first, again):
            await (await transport.publish(copy))
    finally:
        await transport.close()
    received = await consume_nats(connection, subject, 1, idle_seconds=1.0)
    assert [item.message_id for item in received] == [str(first.id)]
    assert received[0].headers["Nats-Msg-Id"] == str(first.id)


async def test_a_subject_no_stream_captures_is_the_rows_fault(nats_url: str) -> None:
    transport = NatsTransport("nats", nats_url)
    await transport.start()
    try:
        subject = unique("nowhere").replace("-", "_")
        with pytest.raises(SendError) as caught:
            await (await transport.publish(message(subject)))
        verdict = classify(caught.value)
        assert (verdict.fault, verdict.permanent) == (Fault.ROW, True)
        assert subject in verdict.text and "create a stream" in verdict.text
        bad = await transport.publish(message("two  words"))
        with pytest.raises(SendError, match="not a NATS subject"):
            await bad
    finally:
        await transport.close()


async def test_a_lost_connection_is_not_the_rows_fault_and_the_client_reconnects(
    proxy: Proxy, stream: tuple[Any, str]
) -> None:
    _, subject = stream
    transport = NatsTransport("nats", proxied_url(proxy), reconnect_interval=0.1)
    await transport.start()
    try:
        proxy.stall()  # nothing is acknowledged, then the connection goes
        waiting = [await transport.publish(message(subject, f"k{n}")) for n in range(20)]
        assert proxy.reset() > 0
        proxy.resume()
        for acknowledgement in waiting:
            with pytest.raises(TransportUnavailableError) as caught:
                await acknowledgement
            assert classify(caught.value).fault is Fault.BROKER
        sent = [message(subject, f"k{n}") for n in range(20)]
        await wait_for(
            lambda: transport._connection is not None and transport._connection.is_connected
        )
        outcomes = await relay_messages(transport, sent)
        assert [item.outcome for item in outcomes] == ["acked"] * 20
    finally:
        await transport.close()


async def test_a_stalled_server_refuses_copies_and_says_so_once(
    proxy: Proxy,
    stream: tuple[Any, str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stalls, "QUIET_SECONDS", 0.0)  # any refusal tells of the stall
    _, subject = stream
    transport = NatsTransport("nats", proxied_url(proxy))
    await transport.start()
    caplog.set_level(logging.INFO, "relayer.transports.nats")
    try:
        first = message(subject)
        proxy.stall()
        acknowledgement = await transport.publish(first)
        for _ in range(3):
            copy = await transport.publish(first)
            with pytest.raises(TransportUnavailableError, match="earlier copy") as caught:
                await copy
            assert classify(caught.value).fault is Fault.BROKER
        stalls_said = [r for r in caplog.records if getattr(r, "action", "") == "transport_stall"]
        assert len(stalls_said) == 1 and "no attempt is counted" in stalls_said[0].getMessage()
        proxy.resume()
        await acknowledgement
        over = [r for r in caplog.records if getattr(r, "action", "") == "transport_stall_over"]
        assert len(over) == 1
    finally:
        proxy.resume()
        await transport.close()


async def test_an_acknowledgement_that_never_comes_times_out_and_close_is_bounded(
    proxy: Proxy, stream: tuple[Any, str]
) -> None:
    _, subject = stream
    transport = NatsTransport("nats", proxied_url(proxy), ack_timeout=0.5)
    await transport.start()
    try:
        proxy.stall()
        acknowledgement = await transport.publish(message(subject))
        with pytest.raises(TransportUnavailableError, match="ack_timeout"):
            await asyncio.wait_for(acknowledgement, 30)
        late = await transport.publish(message(subject, "other"))
        started = time.monotonic()
        await transport.close_within(0.2)
        # Bounded although the server never answers (generously: a busy machine).
        assert time.monotonic() - started < 10
        with pytest.raises(TransportUnavailableError, match="closed before"):
            await late
    finally:
        proxy.resume()
        await transport.close()


async def test_an_unreachable_server_is_a_clear_unavailable_error_without_the_password() -> None:
    transport = NatsTransport(
        "nats", "nats://relayer:hunter2@127.0.0.1:9", connect_timeout=0.5, reconnect_interval=0.1
    )
    with pytest.raises(TransportUnavailableError) as caught:
        await transport.start()
    text = str(caught.value)
    assert "cannot connect NATS transport 'nats'" in text and "127.0.0.1:9" in text
    assert "hunter2" not in text and "hunter2" not in repr(transport)


@pytest.fixture
def without_jetstream() -> Iterator[str]:
    """The URL of a nats-server of the test's own, without JetStream."""
    program = shutil.which("nats-server", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
    if program is None:
        unavailable("nats-server is not installed: the test starts one without JetStream")
    assert program is not None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [program, "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not answers("127.0.0.1", port):
            assert server.poll() is None and time.monotonic() < deadline, "no nats-server"
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(30)


async def test_a_server_without_jetstream_is_refused_at_start(without_jetstream: str) -> None:
    transport = NatsTransport("nats", without_jetstream, connect_timeout=5)
    with pytest.raises(TransportUnavailableError, match="enable JetStream"):
        await transport.start()
