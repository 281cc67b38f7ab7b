"""Reading relayer's fields from broker messages, claim verdicts and sequence headers."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from relayer.errors import InvalidMessageError
from relayer.inbox import Claim, Outcome, delivery_of
from relayer.transports.base import MESSAGE_ID_HEADER, ORDERING_KEY_HEADER, OutgoingMessage
from relayer.writer.sequences import SEQUENCE_HEADER, sequence_of, stamped_json

MESSAGE_ID = uuid.uuid4()


class KafkaLike:
    """The parts of confluent_kafka.Message the inbox reads: headers() and key()."""

    def __init__(self, headers: list[tuple[str, bytes | None]] | None, key: bytes | None) -> None:
        self._headers = headers
        self._key = key

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def key(self) -> bytes | None:
        return self._key


class RabbitLike:
    """The parts of aio_pika.IncomingMessage the inbox reads: message_id and headers."""

    def __init__(self, message_id: str | None, headers: dict[str, Any]) -> None:
        self.message_id = message_id
        self.headers = headers


def test_kafka_messages() -> None:
    message = KafkaLike(
        [
            (MESSAGE_ID_HEADER, str(MESSAGE_ID).encode()),
            (ORDERING_KEY_HEADER, b"order-1"),
            (SEQUENCE_HEADER, b"7"),
            ("empty", None),
        ],
        b"order-1",
    )
    delivery = delivery_of(message)
    assert (delivery.message_id, delivery.key, delivery.sequence) == (MESSAGE_ID, "order-1", 7)
    keyed_only = KafkaLike([(MESSAGE_ID_HEADER, str(MESSAGE_ID).encode())], b"k")
    assert delivery_of(keyed_only).key == "k"  # the Kafka key when the header is missing


def test_rabbitmq_messages() -> None:
    headers = {ORDERING_KEY_HEADER: b"order-1", SEQUENCE_HEADER: "3"}
    delivery = delivery_of(RabbitLike(str(MESSAGE_ID), headers))
    assert (delivery.message_id, delivery.key, delivery.sequence) == (MESSAGE_ID, "order-1", 3)
    from_header = RabbitLike(None, {MESSAGE_ID_HEADER: str(MESSAGE_ID)})
    assert delivery_of(from_header) == delivery_of(from_header)
    assert delivery_of(from_header).message_id == MESSAGE_ID


def test_outgoing_messages_of_the_memory_transport() -> None:
    message = OutgoingMessage(MESSAGE_ID, "d", b"x", "k", {SEQUENCE_HEADER: "2"})
    assert delivery_of(message).sequence == 2 and delivery_of(message).key == "k"


@pytest.mark.parametrize(
    "message",
    [
        KafkaLike(None, None),
        KafkaLike([(MESSAGE_ID_HEADER, b"not-a-uuid")], None),
        RabbitLike(None, {}),
        object(),
    ],
)
def test_a_message_without_a_relayer_id_is_refused(message: object) -> None:
    with pytest.raises(InvalidMessageError, match="relayer-message-id"):
        delivery_of(message)


def test_claims_are_truthy_unless_duplicate() -> None:
    assert Claim(Outcome.NEW, MESSAGE_ID)
    assert Claim(Outcome.REORDERED, MESSAGE_ID, 2, 5)
    assert not Claim(Outcome.DUPLICATE, MESSAGE_ID)
    assert list(Claim(Outcome.GAP, MESSAGE_ID, 6, 2).missing) == [3, 4, 5]
    assert list(Claim(Outcome.IN_ORDER, MESSAGE_ID, 3, 2).missing) == []


@pytest.mark.parametrize("headers", [b"{}", b'{"a":"b"}', b'{"a":"}"}'])
def test_stamping_keeps_the_other_headers(headers: bytes) -> None:
    expected = {**json.loads(headers), SEQUENCE_HEADER: "42"}
    assert json.loads(stamped_json(headers, 42)) == expected


@pytest.mark.parametrize(
    ("value", "number"),
    [("1", 1), (b"19", 19), ("0", None), ("-3", None), ("x", None), ("²", None), (None, None)],
)
def test_sequence_values(value: object, number: int | None) -> None:
    assert sequence_of(value) == number
