"""Every way a traced row's batch can end shows on its send span and on the batch span.

Relay logic on real PostgreSQL with the MemoryTransport's faults (the real brokers' spans are
in tests/contract/test_traced_relay.py). The log lines a batch writes carry its trace id.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any
from uuid import UUID

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from relayer import Outbox, OutboxMessage
from relayer.observability.logs import JsonFormatter
from relayer.relay.batch import LaneRelay
from relayer.relay.results import Scan, ScanResult
from relayer.relay.trace import relay_tracer
from relayer.settings import StoreSettings
from relayer.transports.base import OutboundBatch, Settle
from relayer.transports.memory import MemoryTransport
from relayer.transports.routing import Routing
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import keys_in_lane, parked, pending

LANE = 1


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.fixture
async def traced_store(pg_dsn: str) -> StoreSettings:
    store = make_store(
        pg_dsn,
        lanes=4,
        lease_duration="1s",  # the deadline test waits lease/2 - lease/8 for acknowledgements
        poll_interval="0.2s",
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
    )
    await apply_schema(store)
    return store


@pytest.fixture
async def memory() -> AsyncIterator[MemoryTransport]:
    transport = MemoryTransport("memory")
    await transport.start()
    yield transport
    await transport.close()


async def write_traced(
    store: StoreSettings, provider: TracerProvider, keys: Sequence[str]
) -> list[UUID]:
    """One row per key, written inside a sampled request span."""
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        with provider.get_tracer("shop").start_as_current_span("POST /orders"):
            ids = await Outbox(store).write_many_async(
                conn, [OutboxMessage("events", key.encode(), key=key) for key in keys]
            )
        await conn.commit()
    return ids


async def send(
    store: StoreSettings,
    provider: TracerProvider,
    transport: MemoryTransport,
    before: Callable[[psycopg.AsyncConnection[Any]], None] | None = None,
) -> ScanResult:
    relay = LaneRelay(
        store, Routing(store, {"memory": transport}), "member-a", tracer=relay_tracer(provider)
    )
    conn: psycopg.AsyncConnection[Any] = await psycopg.AsyncConnection.connect(store.require_dsn())
    try:
        if before is not None:
            before(conn)
        [result] = await relay.send_lanes(conn, [LANE])
    finally:
        await conn.close()
    return result


def spans_of(exporter: InMemorySpanExporter) -> tuple[list[ReadableSpan], ReadableSpan]:
    finished = exporter.get_finished_spans()
    sends = [span for span in finished if span.name == "send events"]
    [batch] = [span for span in finished if span.name == "relayer batch"]
    return sends, batch


def attribute(span: ReadableSpan, name: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(name)


async def test_an_unreachable_broker_is_traced_as_unavailable_and_counts_no_attempt(
    traced_store: StoreSettings,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    memory: MemoryTransport,
) -> None:
    await write_traced(traced_store, provider, keys_in_lane(traced_store, LANE, 1))
    memory.disconnect("broker restarting")
    result = await send(traced_store, provider, memory)
    assert result.scan is Scan.UNAVAILABLE
    [span], batch = spans_of(exporter)
    assert attribute(span, "relayer.outcome") == "unavailable"
    assert attribute(span, "error.type") == "relayer.transports.base.TransportUnavailableError"
    assert span.status.status_code is StatusCode.ERROR
    assert "broker restarting" in (span.status.description or "")
    assert attribute(batch, "relayer.result") == "unavailable"
    assert attribute(batch, "relayer.unavailable") == 1
    assert batch.status.status_code is StatusCode.ERROR
    assert parked(traced_store) == {} and pending(traced_store) == 1


async def test_no_acknowledgement_before_the_deadline_is_traced_as_deadline(
    traced_store: StoreSettings,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    memory: MemoryTransport,
) -> None:
    await write_traced(traced_store, provider, keys_in_lane(traced_store, LANE, 1))
    memory.stall()  # handed over, never acknowledged
    result = await send(traced_store, provider, memory)
    assert result.scan is Scan.UNAVAILABLE  # a stalled broker is not the rows' fault
    [span], batch = spans_of(exporter)
    assert attribute(span, "relayer.outcome") == "deadline"
    assert attribute(span, "error.type") == "timeout"
    assert span.status.status_code is StatusCode.ERROR
    assert attribute(batch, "relayer.result") == "deadline"
    assert attribute(batch, "error.type") == "timeout"
    assert pending(traced_store) == 1


class KillsTheBatch(MemoryTransport):
    """Acknowledges everything, but the batch's database connection dies while it sends."""

    def __init__(self, dsn: str) -> None:
        super().__init__("memory")
        self.dsn = dsn
        self.backend = 0

    async def publish_batch(
        self,
        batch: OutboundBatch,
        indexes: Sequence[int],
        settle: Settle,
        admitting: Callable[[], bool],
    ) -> int:
        with psycopg.connect(self.dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (self.backend,))
        return await super().publish_batch(batch, indexes, settle, admitting)


async def test_a_batch_the_database_rolled_back_is_traced_as_failed(
    traced_store: StoreSettings, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    await write_traced(traced_store, provider, keys_in_lane(traced_store, LANE, 1))
    transport = KillsTheBatch(traced_store.require_dsn())
    await transport.start()

    def remember(conn: psycopg.AsyncConnection[Any]) -> None:
        transport.backend = conn.info.backend_pid

    result = await send(traced_store, provider, transport, before=remember)
    assert result.scan is Scan.FAILED
    [span], batch = spans_of(exporter)
    # The broker has the message, but the outbox still holds it: it is sent again.
    assert attribute(span, "relayer.outcome") == "failed"
    assert attribute(span, "error.type") == "relayer.errors.StoreError"
    assert span.status.status_code is StatusCode.ERROR
    assert attribute(batch, "relayer.result") == "failed"
    assert batch.status.status_code is StatusCode.ERROR
    assert len(transport.received("events")) == 1 and pending(traced_store) == 1


async def test_a_parked_head_and_the_later_row_it_holds_back_and_their_log_lines(
    traced_store: StoreSettings,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    memory: MemoryTransport,
) -> None:
    [key] = keys_in_lane(traced_store, LANE, 1)
    head, later = await write_traced(traced_store, provider, [key, key])
    # Gapless (Kafka-like): the head's failure fails the later row published behind it.
    memory.fail_message(head, retryable=False, message="record too large")
    memory.stall()
    lines: list[dict[str, Any]] = []
    handler = logging.Handler()
    handler.setFormatter(JsonFormatter())
    handler.emit = lambda record: lines.append(json.loads(handler.format(record)))  # type: ignore[method-assign]
    relay_logger = logging.getLogger("relayer.relay")
    relay_logger.addHandler(handler)
    try:
        batch = asyncio.create_task(send(traced_store, provider, memory))
        async with asyncio.timeout(10):
            while memory.held < 2:  # both handed over before any outcome is reported
                await asyncio.sleep(0.01)
        memory.resume()
        result = await batch
    finally:
        relay_logger.removeHandler(handler)
    assert (result.sent, result.failed) == (0, 1)
    sends, batch_span = spans_of(exporter)
    by_id = {attribute(span, "messaging.message.id"): span for span in sends}
    assert attribute(by_id[str(head)], "relayer.outcome") == "parked"
    assert attribute(by_id[str(head)], "error.type") == "relayer.transports.base.SendError"
    assert "record too large" in (by_id[str(head)].status.description or "")
    assert attribute(by_id[str(later)], "relayer.outcome") == "kept"
    assert by_id[str(later)].status.status_code is StatusCode.ERROR
    assert attribute(batch_span, "relayer.result") == "parked"
    assert batch_span.context is not None
    [park] = [line for line in lines if line.get("action") == "park"]
    assert park["trace_id"] == f"{batch_span.context.trace_id:032x}"
    assert park["span_id"] == f"{batch_span.context.span_id:016x}"
