"""Reading a topic back from its start on the embedded broker (tansu).

tansu answers a ListOffsets EARLIEST request with the offset of the batch file it wrote
first, not the lowest offset. A large batch whose offsets were reserved first but whose write
ended after that of a later, smaller batch is then skipped whole by a consumer that starts at
OFFSET_BEGINNING, although it is stored and was acknowledged: the chaos suite counted such rows
as lost (docs/chaos.md). The demo's reader and the tests' readers start at offset 0
(tests/unit/test_kafka_readers.py checks that on every run; this scenario shows the broker's
race itself, which takes seconds of producing to catch: ``make chaos``)."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from relayer.demo import consume
from tests.contract.brokers import consume_kafka, create_topics, unique

LARGE = 3_000  # messages of the batch reserved first
SMALL = 20  # single messages produced while it is written
ATTEMPTS = 300  # topics tried until the broker shows the race (1 in 10 to 1 in 60 does)
CHUNK = 20  # topics produced to between two looks


def event(number: int) -> bytes:
    body = {"customer": "c", "sequence": number, "order_id": number, "pad": "x" * 150}
    return json.dumps(body).encode()


def earliest(bootstrap: str, topic: str) -> int:
    """The offset the broker answers a ListOffsets EARLIEST request with."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("marks")})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), 10)[0])
    finally:
        consumer.close()


def raced_topic(bootstrap: str) -> str | None:
    """A topic of one partition where a batch of LARGE messages was reserved first and
    SMALL single messages after it, whose EARLIEST offset the broker answers above 0."""
    common = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"}
    large = Producer(
        {**common, "linger.ms": 20, "batch.num.messages": 10_000, "batch.size": 4_000_000}
    )
    small = Producer({**common, "linger.ms": 0})
    topics = [unique("reads") for _ in range(ATTEMPTS)]
    create_topics(bootstrap, topics, partitions=1)
    for producer in (large, small):  # both know every topic before the first batch
        producer.list_topics(timeout=10)
    for start in range(0, ATTEMPTS, CHUNK):
        chunk = topics[start : start + CHUNK]
        for topic in chunk:
            for number in range(LARGE):
                large.produce(topic, event(number))
            large.poll(0)
            time.sleep(0.021)  # the large batch leaves at its linger; the small ones right after
            for number in range(LARGE, LARGE + SMALL):
                small.produce(topic, event(number))
                small.poll(0)
                time.sleep(0.0003)
            assert large.flush(30) == 0
            assert small.flush(30) == 0
        raced = next((topic for topic in chunk if earliest(bootstrap, topic) > 0), None)
        if raced is not None:
            return raced
    return None


@pytest.mark.chaos
def test_a_read_from_the_start_gets_a_batch_written_after_a_later_one(
    kafka_bootstrap: str,
) -> None:
    topic = raced_topic(kafka_bootstrap)
    if topic is None:
        pytest.skip(
            f"the broker answered EARLIEST with offset 0 for all {ATTEMPTS} topics (a Kafka "
            "broker always does): there is no skipped batch to read"
        )
    # What a read from OFFSET_BEGINNING gets there: the large batch is skipped.
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": unique("group")})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        first = consumer.consume(1, timeout=10)
    finally:
        consumer.close()
    assert first and first[0].offset() > 0
    assert len(consume_kafka(kafka_bootstrap, topic, LARGE + SMALL)) == LARGE + SMALL
    assert len(consume(kafka_bootstrap, topic, LARGE + SMALL)) == LARGE + SMALL
