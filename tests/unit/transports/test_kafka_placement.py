"""A successful delivery report counts only where it places its message
(relayer.transports.kafka.placement): the DUPLICATE_SEQUENCE_NUMBER answer that librdkafka
turns into success at offsets -1, 0, 1..."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from confluent_kafka import Message

from relayer.transports.base import OutboundBatch, TransportUnavailableError
from relayer.transports.kafka import KafkaTransport
from relayer.transports.kafka.placement import Placements
from tests.unit.transports.test_kafka_producer import (
    FakeProducer,
    message,
    settle,
    started_fake,
    until,
)


@pytest.fixture
async def kafka() -> AsyncIterator[tuple[KafkaTransport, list[FakeProducer]]]:
    async with started_fake() as started:
        yield started


def report(offset: int, partition: int = 0, topic: str = "orders") -> Message:
    return Message(topic=topic, partition=partition, offset=offset, value=b"")


def placed(placements: Placements, offsets: list[int], **where: Any) -> list[bool]:
    return [placements.placed(report(offset, **where)) for offset in offsets]


def test_increasing_offsets_are_placed() -> None:
    assert placed(Placements(), [0, 1, 2, 7, 8]) == [True] * 5


def test_a_first_report_is_placed_wherever_it_lands() -> None:
    assert placed(Placements(), [5000]) == [True]


def test_an_answer_without_an_offset_and_the_reports_counting_up_from_it_are_unplaced() -> None:
    # librdkafka's DUPLICATE_SEQUENCE_NUMBER handling: base offset -1 for a 3-message request.
    placements = Placements()
    assert placed(placements, [10, 11]) == [True, True]
    assert placed(placements, [-1, 0, 1]) == [False, False, False]
    # The next answer of the partition places its messages again.
    assert placed(placements, [12, 13]) == [True, True]


def test_the_run_of_an_unplaced_answer_ends_at_an_offset_out_of_step() -> None:
    placements = Placements()
    assert placed(placements, [-1, 0, 5, 6]) == [False, False, True, True]


def test_an_unplaced_answer_on_a_partition_never_acknowledged_before() -> None:
    assert placed(Placements(), [-1, 0, 1, 2]) == [False] * 4


def test_an_offset_below_an_earlier_one_is_still_a_place() -> None:
    # The broker gave it a place (a log truncated by an unclean leader election, a topic
    # created again): that is where it is.
    assert placed(Placements(), [40, 41, 3, 4]) == [True] * 4


def test_an_unplaced_answer_holds_only_its_own_partition() -> None:
    placements = Placements()
    assert placed(placements, [-1], partition=2) == [False]
    assert placed(placements, [0], partition=1) == [True]
    assert placed(placements, [0], topic="payments", partition=2) == [True]
    assert placed(placements, [0, 1], partition=2) == [False, False]
    assert placed(placements, [9], partition=2) == [True]


async def test_publish_fails_unplaced_acknowledgements_as_unavailable(
    kafka: Any, caplog: pytest.LogCaptureFixture
) -> None:
    transport, producers = kafka
    first = [await transport.publish(message(str(n))) for n in range(2)]
    assert [await settle(a) for a in first] == [None, None]
    producers[0].offsets = [None, 0]
    with caplog.at_level(logging.WARNING, logger="relayer.transports.kafka"):
        second = [await transport.publish(message(str(n))) for n in range(2)]
        errors = [await settle(a) for a in second]
    assert all(isinstance(error, TransportUnavailableError) for error in errors)
    assert "without an offset" in str(errors[0]) and "sent again" in str(errors[0])
    [line] = [r.getMessage() for r in caplog.records if "without placing" in r.getMessage()]
    assert "2 message(s)" in line and "sent again" in line and "check the brokers" in line
    third = await transport.publish(message("again"))
    assert await settle(third) is None  # the partition places messages again


async def test_publish_batch_settles_unplaced_rows_as_unavailable(kafka: Any) -> None:
    transport, producers = kafka
    ids = [str(uuid.uuid4()) for _ in range(4)]
    batch = OutboundBatch(ids, ["a", "b", "c", "d"], ["orders"] * 4, [b"x"] * 4, [None] * 4)
    outcomes: dict[int, BaseException | None] = {}
    producers[0].offsets = [0, None, 0, 1]  # one placed, then a DUPLICATE_SEQUENCE answer
    handed = await transport.publish_batch(batch, range(4), outcomes.__setitem__, lambda: True)
    assert handed == 4
    await until(lambda: len(outcomes) == 4)
    assert outcomes[0] is None
    assert all(isinstance(outcomes[index], TransportUnavailableError) for index in (1, 2, 3))
    # Nothing of theirs waits in the producer any more: they can be published again.
    again: dict[int, BaseException | None] = {}
    await transport.publish_batch(batch, range(1, 4), again.__setitem__, lambda: True)
    await until(lambda: len(again) == 3)
    assert again == {1: None, 2: None, 3: None}
