"""The SQS transport against moto's server: FIFO ids, standard queues, a batch refused for one
entry, SQS that cannot be reached or does not answer, and a bounded close."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

import pytest

from relayer.testing.pipeline import relay_messages
from relayer.transports import stalls
from relayer.transports.base import OutgoingMessage, TransportUnavailableError
from relayer.transports.sqs import SQSTransport
from tests.contract.brokers import (
    SQS_CREDENTIALS,
    SQS_REGION,
    consume_sqs,
    create_queue,
    sqs_client,
    unique,
)


def sqs(endpoint: str, **options: float) -> SQSTransport:
    return SQSTransport(
        "sqs", SQS_REGION, endpoint_url=endpoint, credentials=SQS_CREDENTIALS, **options
    )  # type: ignore[arg-type]


@pytest.fixture
async def transport(sqs_endpoint: str) -> AsyncIterator[SQSTransport]:
    opened = sqs(sqs_endpoint)
    await opened.start()
    try:
        yield opened
    finally:
        await opened.close_within(5)


def message(destination: str, key: str | None, body: bytes = b"{}") -> OutgoingMessage:
    return OutgoingMessage(uuid.uuid4(), destination, body, key=key)


async def test_group_and_deduplication_ids_are_the_key_and_the_outbox_id(
    sqs_endpoint: str, transport: SQSTransport
) -> None:
    queue = unique("ids") + ".fifo"
    url = await create_queue(sqs_endpoint, queue)
    sent = message(queue, "order-42")
    again = OutgoingMessage(sent.id, queue, sent.body, key="order-42")  # a resend
    assert [s.outcome for s in await relay_messages(transport, [sent])] == ["acked"]
    assert [s.outcome for s in await relay_messages(transport, [again])] == ["acked"]
    async with sqs_client(sqs_endpoint) as client:
        answer = await client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"], VisibilityTimeout=60
        )
    [stored] = answer["Messages"]  # the resend was deduplicated
    assert stored["Attributes"]["MessageGroupId"] == "order-42"
    assert stored["Attributes"]["MessageDeduplicationId"] == str(sent.id)


async def test_a_standard_queue_is_refused_for_ordered_rows_only(
    sqs_endpoint: str, transport: SQSTransport
) -> None:
    queue = unique("standard")
    await create_queue(sqs_endpoint, queue)
    assert await transport.ordered_by_key(queue) is False
    outcomes = await relay_messages(transport, [message(queue, "k"), message(queue, None)])
    assert [sent.outcome for sent in outcomes] == ["failed", "acked"]
    assert outcomes[0].permanent is False  # the relay's capability check: redrive once fixed
    assert "does not keep per-key order" in outcomes[0].error
    assert len(await consume_sqs(sqs_endpoint, queue, 1)) == 1


async def test_a_batch_refused_for_one_entry_fails_only_that_entry(
    sqs_endpoint: str, transport: SQSTransport
) -> None:
    queue = unique("partial") + ".fifo"
    url = await create_queue(sqs_endpoint, queue)
    assert await transport.ordered_by_key(queue)  # the transport knows its size: 1 MiB
    async with sqs_client(sqs_endpoint) as client:
        await client.set_queue_attributes(QueueUrl=url, Attributes={"MaximumMessageSize": "1024"})
    messages = [message(queue, f"k{number}", b"x" * 100) for number in range(8)]
    messages[3] = message(queue, "k3", b"x" * 5_000)  # SQS refuses the whole batch for it
    outcomes = await relay_messages(transport, messages)
    assert [sent.outcome for sent in outcomes] == ["acked"] * 3 + ["failed"] + ["acked"] * 4
    assert outcomes[3].permanent
    assert "fix the row" in outcomes[3].error
    received = await consume_sqs(sqs_endpoint, queue, 7)
    assert sorted(got.key or "" for got in received) == [f"k{n}" for n in range(8) if n != 3]


async def test_sqs_out_of_reach_counts_no_attempt(unused_tcp_port: int) -> None:
    transport = sqs(f"http://127.0.0.1:{unused_tcp_port}", connect_timeout=1)
    await transport.start()
    try:
        with pytest.raises(TransportUnavailableError, match="no attempt is counted"):
            await transport.ordered_by_key("orders.fifo")
        [outcome] = await relay_messages(transport, [message("orders.fifo", None)])
    finally:
        await transport.close_within(1)
    assert outcome.outcome == "unavailable"


@pytest.fixture
async def silent_endpoint() -> AsyncIterator[str]:
    """An endpoint that accepts connections and never answers (a stalled SQS)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        server.close()


async def test_a_stalled_sqs_gets_no_second_copy_and_close_is_bounded(
    sqs_endpoint: str,
    silent_endpoint: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stalls, "QUIET_SECONDS", 0.0)  # any silence is a stall here
    queue = unique("stalled") + ".fifo"
    await create_queue(sqs_endpoint, queue)
    transport = sqs(silent_endpoint, timeout=60)
    await transport.start()
    # The queue is known (looked up on moto): only the sends go to the silent endpoint.
    real = sqs(sqs_endpoint)
    await real.start()
    known = await real._queues.get(real._client, queue)
    await real.close()
    transport._queues._known[queue] = known
    sent = message(queue, "k")
    [first] = await relay_messages(transport, [sent], deadline=0.5)
    assert first.outcome == "unacknowledged"
    with caplog.at_level(logging.WARNING, "relayer.transports.sqs"):
        for _ in range(3):
            [again] = await relay_messages(transport, [sent])
            assert again.outcome == "unavailable"
            assert "still waits" in again.error
    said = [record for record in caplog.records if "stalled" in record.getMessage()]
    assert len(said) == 1
    acknowledgement = await transport.publish(message(queue, "other"))
    async with asyncio.timeout(30):  # far beyond the 0.2 s asked: close must not hang
        await transport.close_within(0.2)
    with pytest.raises(TransportUnavailableError, match="closed before SQS answered"):
        await acknowledgement
