"""The transport contract, checked against real brokers with real consumers, each transport
driven through the relay's own send pipelines (relayer.testing.pipeline)."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from collections.abc import Sequence

import pytest

from relayer.testing.pipeline import relay_messages
from relayer.transports.base import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    DestinationError,
    OutgoingMessage,
    Transport,
)
from tests.contract.brokers import Broker, Received

KEYS = 1_000
PER_KEY = 5


def batch(destination: str, keys: int, per_key: int) -> list[OutgoingMessage]:
    """Rows for each key, interleaved (k0#0, k1#0, ..., k0#1, ...), in id order."""
    return [
        OutgoingMessage(uuid.uuid4(), destination, f"k{key}#{number}".encode(), key=f"k{key}")
        for number in range(per_key)
        for key in range(keys)
    ]


def sequences(received: Sequence[Received]) -> dict[str, list[int]]:
    """key -> the sequence numbers its messages arrived in."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for message in received:
        key, number = message.body.decode().rsplit("#", 1)
        assert message.key == key
        by_key[key].append(int(number))
    return by_key


async def test_contents_are_preserved(broker: Broker, transport: Transport) -> None:
    destination = await broker.destination()
    bodies = [b"\xff\x00\xfe binary \x80", b"", "ünïcödé ✓".encode(), b"x" * 10_000]
    headers = {"content-type": "application/x-test", "trace": "ünï", "empty": ""}
    messages = [
        OutgoingMessage(uuid.uuid4(), destination, body, key="order-42", headers=headers)
        for body in bodies
    ]
    messages.append(OutgoingMessage(uuid.uuid4(), destination, b"no key", key=None))
    outcomes = await relay_messages(transport, messages)
    assert [sent.outcome for sent in outcomes] == ["acked"] * len(messages)

    received = await broker.consume(destination, len(messages))
    by_id = {message.message_id: message for message in received}
    assert len(received) == len(messages)
    for sent in messages:
        got = by_id[str(sent.id)]
        assert got.body == sent.body
        assert got.key == sent.key
        for name, value in sent.headers.items():
            assert got.headers[name] == value
        assert got.headers[MESSAGE_ID_HEADER] == str(sent.id)
        if sent.key is not None:
            assert got.headers[ORDERING_KEY_HEADER] == sent.key
        else:
            assert ORDERING_KEY_HEADER not in got.headers


async def test_per_key_order_with_many_keys_in_flight(broker: Broker, transport: Transport) -> None:
    destination = await broker.destination()
    assert await transport.ordered_by_key(destination) is True
    messages = batch(destination, KEYS, PER_KEY)
    outcomes = await relay_messages(transport, messages, deadline=broker.deadline)
    assert [sent for sent in outcomes if sent.outcome != "acked"] == []

    received = await broker.consume(destination, len(messages))
    assert len(received) == len(messages)
    order = sequences(received)
    assert len(order) == KEYS
    assert all(numbers == list(range(PER_KEY)) for numbers in order.values())


async def test_failure_mid_batch_never_lets_a_later_message_overtake(
    broker: Broker, transport: Transport
) -> None:
    destination = await broker.destination()
    keys, per_key = 50, 4
    messages = batch(destination, keys, per_key)
    # The second message of key k7 fails; k7's third and fourth must not arrive before it.
    failing_index = keys + 7
    messages[failing_index] = broker.failing(messages[failing_index])
    outcomes = await relay_messages(transport, messages)

    # Refused by the broker, or (RabbitMQ: an exchange without per-key order) by the relay's
    # capability check before any publish: either way the row's fault, its key stops here.
    failure = outcomes[failing_index]
    assert failure.outcome == "failed" and failure.error
    for later in (failing_index + keys, failing_index + 2 * keys):
        assert outcomes[later].outcome in ("failed", "unsent")  # failed with it, or never sent
    others = [sent.outcome for index, sent in enumerate(outcomes) if messages[index].key != "k7"]
    assert others == ["acked"] * len(others)

    received = await broker.consume(destination, len(messages) - 3)
    order = sequences(received)
    assert order["k7"] == [0]
    assert all(order[f"k{key}"] == list(range(per_key)) for key in range(keys) if key != 7)


async def test_close_resolves_every_acknowledgement(broker: Broker, transport: Transport) -> None:
    destination = await broker.destination()
    messages = batch(destination, 100, 3)
    acknowledgements = [asyncio.ensure_future(await transport.publish(m)) for m in messages]
    await transport.close()
    assert all(acknowledgement.done() for acknowledgement in acknowledgements)
    assert [a.exception() for a in acknowledgements] == [None] * len(messages)
    received = await broker.consume(destination, len(messages))
    assert len(received) == len(messages)


async def test_a_bad_destination_fails_only_its_messages(
    broker: Broker, transport: Transport
) -> None:
    good = await broker.destination()
    bad = broker.bad_destination()
    messages = []
    for number in range(20):
        target = bad if number % 4 == 1 else good
        messages.append(
            OutgoingMessage(uuid.uuid4(), target, f"k{number % 5}#{number}".encode(), key=None)
        )
    outcomes = await relay_messages(transport, messages)
    for message, sent in zip(messages, outcomes, strict=True):
        if message.destination == good:
            assert sent.outcome == "acked"
        else:
            assert (sent.outcome, sent.permanent) == ("failed", True)
            text = sent.error
            assert bad.split("/")[0] in text
            assert "create" in text or "declare" in text or "fix the destination" in text
    received = await broker.consume(good, 15)
    assert len(received) == 15


async def test_ordered_by_key_refuses_an_unknown_destination(
    broker: Broker, transport: Transport
) -> None:
    with pytest.raises(DestinationError) as caught:
        await transport.ordered_by_key(broker.bad_destination())
    assert broker.bad_destination().split("-")[0] in str(caught.value)
