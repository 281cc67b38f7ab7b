"""Tracing without I/O: the writer's header capture and the relay's send spans."""

from __future__ import annotations

import sys
import uuid

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, StatusCode, TraceFlags, TraceState

from relayer.tracing import relay_tracer, with_trace_context
from relayer.transports.base import OutgoingMessage
from relayer.transports.memory import MemoryTransport

SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_without_an_active_span_headers_pass_unchanged() -> None:
    headers = {"tenant": "eu"}
    assert with_trace_context(headers) is headers
    assert with_trace_context(None) is None


def test_without_opentelemetry_imported_nothing_is_looked_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "opentelemetry.trace")
    assert with_trace_context(None) is None


def test_the_active_span_becomes_traceparent_and_tracestate() -> None:
    context = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "value")]),
    )
    with trace.use_span(NonRecordingSpan(context)):
        headers = with_trace_context({"tenant": "eu"})
        caller_set = {"TraceParent": UNSAMPLED}
        assert with_trace_context(caller_set) is caller_set  # never overwritten
    assert headers == {"tenant": "eu", "traceparent": SAMPLED, "tracestate": "vendor=value"}


def test_tracing_is_off_without_a_configured_provider() -> None:
    assert relay_tracer() is None  # the global provider is OpenTelemetry's proxy default
    assert relay_tracer(trace.NoOpTracerProvider()) is None


async def test_send_spans_only_for_sampled_messages_with_their_outcome(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    tracer = relay_tracer(provider)
    assert tracer is not None
    memory = MemoryTransport("memory")
    await memory.start()
    transport = tracer.wrap({"memory": memory})["memory"]
    assert transport.name == "memory"
    assert transport.pipelines_within_key == memory.pipelines_within_key
    failing = uuid.uuid4()
    memory.fail_message(failing, retryable=False, message="rejected")
    messages = [
        OutgoingMessage(uuid.uuid4(), "events", b"a", "k", {"traceparent": SAMPLED}),
        OutgoingMessage(failing, "events", b"b", "k2", {"traceparent": SAMPLED}),
        OutgoingMessage(uuid.uuid4(), "events", b"c", "k3", {"traceparent": UNSAMPLED}),
        OutgoingMessage(uuid.uuid4(), "events", b"d", "k4"),
    ]
    with tracer.batch("orders", [3]):
        outcomes = []
        for message in messages:
            acknowledgement = await transport.publish(message)
            try:
                await acknowledgement
                outcomes.append("ok")
            except Exception:
                outcomes.append("failed")
        batch_context = trace.get_current_span().get_span_context()
    assert outcomes == ["ok", "failed", "ok", "ok"]
    sends = [span for span in exporter.get_finished_spans() if span.name == "send events"]
    assert [span.attributes and span.attributes["messaging.message.id"] for span in sends] == [
        str(messages[0].id),
        str(failing),
    ]
    assert sends[0].status.status_code is StatusCode.UNSET
    assert sends[1].status.status_code is StatusCode.ERROR
    assert "rejected" in (sends[1].status.description or "")
    for span in sends:
        assert span.parent is not None and span.parent.span_id == 0xB7AD6B7169203331
        assert [link.context.span_id for link in span.links] == [batch_context.span_id]
    await transport.close()
