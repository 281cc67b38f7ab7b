"""Tracing without I/O: the writer's header capture, the batch span, the log lines' ids."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, StatusCode, TraceFlags, TraceState

from relayer.observability.logs import JsonFormatter
from relayer.observability.tracing import current_trace_ids, with_trace_context
from relayer.relay.results import Scan, ScanResult
from relayer.relay.trace import relay_tracer
from relayer.settings import store_settings
from relayer.transports.routing import Routing

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


def test_a_batch_that_ran_out_of_time_is_an_error_with_the_timeout_type(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    tracer = relay_tracer(provider)
    assert tracer is not None
    with tracer.batch("orders", [3], Routing(store_settings(name="orders"), {})) as batch:
        batch.rolled_back(TimeoutError())
        batch.finish([ScanResult(3, Scan.FAILED, 1.0, detail="batch deadline passed")])
    [span] = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["relayer.result"] == "deadline"
    assert span.attributes["error.type"] == "timeout"
    assert span.status.status_code is StatusCode.ERROR


def test_json_log_lines_carry_the_active_spans_ids(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = spans
    formatter = JsonFormatter()

    def line() -> dict[str, object]:
        record = logging.LogRecord("relayer.relay", logging.WARNING, __file__, 1, "m", None, None)
        parsed: dict[str, object] = json.loads(formatter.format(record))
        return parsed

    assert "trace_id" not in line() and "span_id" not in line()
    with provider.get_tracer("test").start_as_current_span("work") as span:
        inside = line()
    context = span.get_span_context()
    assert inside["trace_id"] == f"{context.trace_id:032x}"
    assert inside["span_id"] == f"{context.span_id:016x}"
    assert current_trace_ids() is None


def test_ids_set_by_opentelemetrys_logging_instrumentation_win() -> None:
    record = logging.LogRecord("relayer", logging.INFO, __file__, 1, "m", None, None)
    record.otelTraceID = "0af7651916cd43dd8448eb211c80319c"
    record.otelSpanID = "b7ad6b7169203331"
    line = json.loads(JsonFormatter().format(record))
    assert (line["trace_id"], line["span_id"]) == (record.otelTraceID, record.otelSpanID)
    record.otelTraceID, record.otelSpanID = "0", "0"  # what it sets outside any span
    assert "trace_id" not in json.loads(JsonFormatter().format(record))
