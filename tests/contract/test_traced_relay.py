"""Traced lane batches over every transport: OpenTelemetry's messaging conventions on the send
spans, and a row the broker cannot take (a missing topic or exchange) traced as parked."""

from __future__ import annotations

from typing import Any

import psycopg
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from relayer import Outbox, OutboxMessage
from relayer.relay.batch import LaneRelay
from relayer.relay.results import Scan
from relayer.relay.trace import relay_tracer
from relayer.transports.base import Transport
from relayer.transports.routing import Routing
from tests.contract.brokers import Broker
from tests.contract.test_relay_contract import relay_store
from tests.integration.relay.helpers import keys_in_lane, parked

SYSTEMS = {
    "memory": ("memory", "send"),
    "kafka": ("kafka", "send"),
    "rabbitmq": ("rabbitmq", "publish"),
    "nats": ("nats", "publish"),
    "redis": ("redis", "send"),
    "webhooks": ("webhooks", "send"),  # no convention for webhooks: the transport's name
    "sqs": ("aws_sqs", "send"),
}


async def test_send_spans_follow_the_messaging_conventions_and_say_what_became_of_each_row(
    broker: Broker, transport: Transport, pg_dsn: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    store = await relay_store(pg_dsn, transport)
    good, bad = await broker.destination(), broker.bad_destination()
    good_key, bad_key = keys_in_lane(store, 2, 2)
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        with provider.get_tracer("shop").start_as_current_span("POST /orders") as request:
            good_id, bad_id = await Outbox(store).write_many_async(
                conn,
                [
                    OutboxMessage(good, b"fine", key=good_key),
                    OutboxMessage(bad, b"lost", key=bad_key),
                ],
            )
        await conn.commit()
    relay = LaneRelay(
        store,
        Routing(store, {transport.name: transport}),
        "member-a",
        tracer=relay_tracer(provider),
    )
    batch_conn: psycopg.AsyncConnection[Any] = await psycopg.AsyncConnection.connect(pg_dsn)
    try:
        [result] = await relay.send_lanes(batch_conn, [2])
    finally:
        await batch_conn.close()
    assert (result.scan, result.sent, result.failed) == (Scan.SENT, 1, 1)
    assert list(parked(store)) == [bad_key]

    system, operation = SYSTEMS[broker.name]
    spans = {span.name: span for span in exporter.get_finished_spans()}
    sent, lost = spans[f"{operation} {good}"], spans[f"{operation} {bad}"]
    trace_id = request.get_span_context().trace_id
    for span, message_id, destination in ((sent, good_id, good), (lost, bad_id, bad)):
        assert span.kind is SpanKind.PRODUCER
        assert span.context is not None and span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == request.get_span_context().span_id
        attributes = dict(span.attributes or {})
        assert attributes["messaging.system"] == system
        assert attributes["messaging.operation.name"] == operation
        assert attributes["messaging.operation.type"] == "send"
        assert attributes["messaging.destination.name"] == destination
        assert attributes["messaging.message.id"] == str(message_id)
        assert span.start_time is not None and span.end_time is not None
        assert span.start_time <= span.end_time
    assert sent.attributes is not None and lost.attributes is not None
    assert sent.attributes["relayer.outcome"] == "sent"
    assert "error.type" not in sent.attributes
    assert sent.status.status_code is StatusCode.UNSET
    assert lost.attributes["relayer.outcome"] == "parked"
    assert lost.attributes["error.type"] == "relayer.transports.base.DestinationError"
    assert lost.status.status_code is StatusCode.ERROR
    assert "destination" in (lost.status.description or "")

    # The batch says a key was parked, not merely "sent".
    batch = spans["relayer batch"]
    assert batch.attributes is not None
    assert batch.attributes["relayer.result"] == "parked"
    assert (batch.attributes["relayer.sent"], batch.attributes["relayer.parked"]) == (1, 1)
    assert batch.attributes["error.type"] == "relayer.transports.base.DestinationError"
    assert batch.status.status_code is StatusCode.ERROR
    assert [link.context.span_id for link in sent.links] == [_span_id(batch)]


def _span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id
