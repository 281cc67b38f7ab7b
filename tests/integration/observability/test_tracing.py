"""One trace from the request that wrote a row, through the relay, to the Kafka message."""

from __future__ import annotations

import asyncio

import psycopg
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from relayer import Outbox
from relayer.settings import WorkerSettings
from relayer.transports.kafka import KafkaTransport
from relayer.worker import Worker
from tests.conftest import apply_schema, make_store
from tests.contract.brokers import consume_kafka, create_topics, unique
from tests.integration.relay.helpers import pending

# A context the application propagates itself (not sampled): kept as is, and given no span.
OWN_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


async def test_writer_span_relay_span_and_kafka_header_share_one_trace_id(
    pg_dsn: str, kafka_bootstrap: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("shop")
    topic = unique("traced")
    await asyncio.to_thread(create_topics, kafka_bootstrap, [topic], 2)
    store = make_store(
        pg_dsn,
        lanes=4,
        lease_duration="3s",
        poll_interval="0.1s",
        transports={"kafka": {"type": "kafka", "bootstrap.servers": kafka_bootstrap}},
        default_transport="kafka",
    )
    await apply_schema(store)

    outbox = Outbox(store)
    async with await psycopg.AsyncConnection.connect(store.require_dsn()) as conn:
        with tracer.start_as_current_span("POST /orders") as request:
            await outbox.write_async(conn, destination=topic, body=b"traced", key="order-1")
            await outbox.write_async(
                conn,
                destination=topic,
                body=b"own",
                key="order-2",
                headers={"traceparent": OWN_TRACEPARENT},
            )
        await outbox.write_async(conn, destination=topic, body=b"plain", key="order-3")
        await conn.commit()

    worker = Worker(
        [store],
        transports={
            "orders": {"kafka": KafkaTransport("kafka", {"bootstrap.servers": kafka_bootstrap})}
        },
        settings=WorkerSettings(pool_size=2),
        tracer_provider=provider,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        async with asyncio.timeout(30):
            while pending(store):
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    received = {
        message.body: message
        for message in await asyncio.to_thread(consume_kafka, kafka_bootstrap, topic, 3)
    }

    # The writer captured the request's context; the broker message carries it unchanged.
    written = request.get_span_context()
    trace_id = f"{written.trace_id:032x}"
    flags = f"{int(written.trace_flags):02x}"  # sampled (the SDK may add W3C level 2 "random")
    expected = f"00-{trace_id}-{written.span_id:016x}-{flags}"
    assert received[b"traced"].headers["traceparent"] == expected
    assert received[b"own"].headers["traceparent"] == OWN_TRACEPARENT
    assert "traceparent" not in received[b"plain"].headers

    # The relay's send span continues the request's trace and links to its batch span.
    finished = exporter.get_finished_spans()
    sends = [span for span in finished if span.name == f"send {topic}"]
    assert len(sends) == 1  # the unsampled and the untraced rows get no per-message span
    send = sends[0]
    assert send.kind is SpanKind.PRODUCER
    assert send.context is not None and send.parent is not None
    assert f"{send.context.trace_id:032x}" == trace_id
    assert send.parent.span_id == written.span_id
    assert send.attributes is not None
    assert send.attributes["messaging.destination.name"] == topic
    batches = {_span_id(span): span for span in finished if span.name == "relayer batch"}
    linked = [batches[link.context.span_id] for link in send.links]
    assert len(linked) == 1 and linked[0].attributes is not None
    assert linked[0].attributes["relayer.store"] == "orders"
    assert linked[0].attributes["relayer.result"] == "sent"

    # A consumer extracting the header continues the same trace.
    context = TraceContextTextMapPropagator().extract(dict(received[b"traced"].headers))
    with tracer.start_as_current_span("consume order", context=context):
        consumer = get_current_span().get_span_context()
    assert f"{consumer.trace_id:032x}" == trace_id
    print(f"trace {trace_id}: writer {written.span_id:016x} -> send {send.context.span_id:016x}")


def _span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id
