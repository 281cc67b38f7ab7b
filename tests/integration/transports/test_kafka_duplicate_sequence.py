"""A produce reply lost on its way, on the embedded broker with the real client: librdkafka
retries the request with the same sequence numbers, the broker answers
DUPLICATE_SEQUENCE_NUMBER, and librdkafka reports the messages delivered without an offset
(None, then 0, 1... counting up from the answer's -1). The Kafka transport takes none of those
reports as an acknowledgement (relayer.transports.kafka.placement): the relay sends the rows
again rather than delete them on the broker's word alone."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator

import pytest

from relayer.transports.base import OutboundBatch, TransportUnavailableError
from relayer.transports.kafka import KafkaTransport
from tests.chaos.brokers import kafka_topic_behind_proxy
from tests.chaos.proxy import LoopThread, Proxy
from tests.contract.brokers import consume_kafka


@pytest.fixture
def kafka_behind_proxy() -> Iterator[tuple[LoopThread, Proxy, str, str]]:
    """A tansu broker of this test's own, advertised through a proxy; (loop, proxy,
    bootstrap, topic of one partition)."""
    loop = LoopThread()
    try:
        with kafka_topic_behind_proxy(loop, "dupseq", partitions=1) as (proxy, _, bootstrap, topic):
            yield loop, proxy, bootstrap, topic
    finally:
        loop.close()


def batch(topic: str, bodies: list[bytes]) -> OutboundBatch:
    ids = [str(uuid.uuid4()) for _ in bodies]
    count = len(bodies)
    return OutboundBatch(ids, ["key"] * count, [topic] * count, bodies, [None] * count)


async def until_settled(outcomes: dict[int, BaseException | None], count: int) -> None:
    deadline = time.monotonic() + 30
    while len(outcomes) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert len(outcomes) == count, outcomes


async def test_a_retry_answered_duplicate_sequence_acknowledges_nothing(
    kafka_behind_proxy: tuple[LoopThread, Proxy, str, str], caplog: pytest.LogCaptureFixture
) -> None:
    loop, proxy, bootstrap, topic = kafka_behind_proxy
    transport = KafkaTransport("events", {"bootstrap.servers": bootstrap, "log_level": 3})
    await transport.start()
    try:
        first: dict[int, BaseException | None] = {}
        await transport.publish_batch(
            batch(topic, [b"first"]), [0], first.__setitem__, lambda: True
        )
        await until_settled(first, 1)
        assert first == {0: None}  # acknowledged at an offset
        loop.call(proxy.hold_replies)
        held: dict[int, BaseException | None] = {}
        sent = batch(topic, [b"m0", b"m1", b"m2"])
        with caplog.at_level(logging.WARNING, logger="relayer.transports.kafka"):
            await transport.publish_batch(sent, [0, 1, 2], held.__setitem__, lambda: True)
            await asyncio.sleep(1.0)  # the broker stores them; its replies wait in the proxy
            assert held == {}
            loop.call(proxy.reset)  # the replies are lost with the connection
            loop.call(proxy.resume)
            await until_settled(held, 3)
    finally:
        await transport.close()
    assert all(isinstance(error, TransportUnavailableError) for error in held.values()), held
    assert "without an offset" in str(held[0]) and "sent again" in str(held[0])
    assert any("without placing them" in record.getMessage() for record in caplog.records)
    # Here the first attempt was stored: sending the rows again makes duplicates, not a loss.
    read = consume_kafka(bootstrap, topic, 4)
    assert [message.body for message in read] == [b"first", b"m0", b"m1", b"m2"]
