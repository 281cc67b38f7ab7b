"""The demo's and the tests' Kafka readers start every partition at offset 0, never at
OFFSET_BEGINNING: the embedded broker answers EARLIEST with the batch it wrote first, not the
lowest offset, so a read from OFFSET_BEGINNING can skip a whole stored batch
(docs/chaos.md)."""

from __future__ import annotations

from typing import Any, ClassVar

import confluent_kafka
import pytest

from relayer.demo import consume
from tests.contract.brokers import consume_kafka


class FakeConsumer:
    """A topic of three empty partitions; remembers what it was assigned."""

    made: ClassVar[list[FakeConsumer]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.assigned: list[Any] = []
        FakeConsumer.made.append(self)

    def list_topics(self, topic: str, timeout: float) -> Any:
        partitions = {number: None for number in range(3)}
        topics = {topic: type("Topic", (), {"partitions": partitions})()}
        return type("Metadata", (), {"topics": topics})()

    def assign(self, partitions: list[Any]) -> None:
        self.assigned = [(item.topic, item.partition, item.offset) for item in partitions]

    def consume(self, count: int, timeout: float) -> list[Any]:
        return []

    def close(self) -> None:
        pass


@pytest.mark.parametrize("read", [consume, consume_kafka])
def test_every_partition_is_read_from_offset_zero(
    read: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeConsumer.made = []
    monkeypatch.setattr(confluent_kafka, "Consumer", FakeConsumer)
    assert read("127.0.0.1:9", "orders", 0) == []
    [consumer] = FakeConsumer.made
    assert consumer.assigned == [("orders", 0, 0), ("orders", 1, 0), ("orders", 2, 0)]
    assert confluent_kafka.OFFSET_BEGINNING != 0
    # A real Kafka log whose start is above 0 is read from its start, not from its end.
    assert consumer.config["auto.offset.reset"] == "earliest"
