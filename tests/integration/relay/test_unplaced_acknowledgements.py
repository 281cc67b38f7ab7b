"""A Kafka acknowledgement that does not place its message deletes nothing: on real
PostgreSQL, a lane batch whose producer answers success without an offset (librdkafka's
handling of a DUPLICATE_SEQUENCE_NUMBER answer) keeps those rows, counts no attempt, and the
next batch sends and deletes them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from relayer.relay.batch import LaneRelay
from relayer.relay.results import Scan
from relayer.settings import StoreSettings
from relayer.transports.kafka import KafkaTransport
from relayer.transports.routing import Routing
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import BATCH_STORE, keys_in_lane, parked, pending, write
from tests.unit.transports.test_kafka_producer import FakeProducer, started_fake

MEMBER = "member-a"


@pytest.fixture
async def relay_store(pg_dsn: str) -> StoreSettings:
    kafka = {"type": "kafka", "bootstrap.servers": "127.0.0.1:9"}
    store = make_store(
        pg_dsn, **BATCH_STORE, transports={"kafka": kafka}, default_transport="kafka"
    )
    await apply_schema(store)
    return store


@pytest.fixture
async def kafka() -> AsyncIterator[tuple[KafkaTransport, list[FakeProducer]]]:
    async with started_fake() as started:
        yield started


async def send(relay: LaneRelay, lane: int) -> Any:
    conn = await psycopg.AsyncConnection.connect(relay.store.require_dsn())
    try:
        [result] = await relay.send_lanes(conn, [lane])
        return result
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("offsets", "first_sent"),
    [
        # One produce request of three messages answered DUPLICATE_SEQUENCE_NUMBER with base
        # offset -1: librdkafka reports them delivered at offsets -1, 0 and 1.
        ([None, 0, 1], 0),
        # The first placed, the other two one such answer: only the first is deleted.
        ([0, None, 0], 1),
    ],
)
async def test_rows_acknowledged_without_a_place_stay_and_go_again(
    relay_store: StoreSettings, kafka: Any, offsets: list[int | None], first_sent: int
) -> None:
    transport, producers = kafka
    relay = LaneRelay(relay_store, Routing(relay_store, {"kafka": transport}), MEMBER)
    [key] = keys_in_lane(relay_store, 2, 1)
    write(relay_store, [key], per_key=3)
    producers[0].offsets = list(offsets)
    result = await send(relay, 2)
    assert result.sent == first_sent
    if not first_sent:
        assert result.scan is Scan.UNAVAILABLE  # the broker's doing: no attempt counted
        assert "without an offset" in result.detail
    assert pending(relay_store) == 3 - first_sent
    assert parked(relay_store) == {}
    result = await send(relay, 2)
    assert (result.scan, result.sent) == (Scan.SENT, 3 - first_sent)
    assert pending(relay_store) == 0
