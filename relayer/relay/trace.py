"""The relay's OpenTelemetry spans (the ``otel`` extra), off unless an SDK tracer provider is
configured.

``relay_tracer`` returns None without the extra or without a configured provider, and the relay
then does no tracing work at all. Otherwise each lane batch gets one ``relayer batch`` span (a
root: a batch serves many requests) saying how the batch ended, and each message whose stored
``traceparent`` is sampled gets a PRODUCER send span (OpenTelemetry's messaging conventions),
child of the writer's span (relayer.observability.tracing put its context in the row's headers)
and linked to its batch, from hand-over to the broker's answer. Those spans are made when the
batch's outcome is known (with the times the send pipeline recorded), so each says what became
of its row: ``relayer.outcome`` is one of ``OUTCOMES``. A row the batch never tried to send
(admission ended, an earlier row of its key failed) gets none: its next batch traces it.
Unsampled or untraced rows get no per-message span: a span per row would cost more than the
publish itself. Headers reach the broker unchanged, so a consumer that extracts ``traceparent``
continues the writer's trace.

Only this module and relayer.observability.tracing name opentelemetry, and both import it
lazily.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from relayer.observability.tracing import TRACEPARENT
from relayer.redact import redact
from relayer.relay.pipeline import FAILED, IN_FLIGHT, SendReport
from relayer.relay.results import ScanResult
from relayer.store import LaneRows
from relayer.transports.base import Transport
from relayer.transports.routing import Routing, error_type

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

# What became of a traced row (``relayer.outcome`` of its send span).
OUTCOMES = {
    "sent": "acknowledged and deleted from the outbox",
    "parked": "failed: its key is parked with this row's error",
    "unavailable": "its broker could not be reached: kept, no attempt counted",
    "deadline": "no acknowledgement before the batch's deadline: kept and sent again",
    "failed": "the batch's database work failed and rolled back: kept and sent again",
    "kept": "handed over, but an earlier row of its key failed: sent again after it",
}
# A batch's result, the most telling first (its span reports the first that applies). The
# first four are errors.
_BATCH_RESULTS = ("failed", "deadline", "unavailable", "parked", "sent", "busy", "future", "empty")
_ERRORS = frozenset(_BATCH_RESULTS[:4])
# OpenTelemetry's error.type for an operation that ran out of time.
TIMEOUT = "timeout"
_NO_ACKNOWLEDGEMENT = "no acknowledgement before the batch's deadline; the row is sent again"
# messaging.operation.name of a send, by messaging.system (the conventions' names).
# NATS and Redis have no name in the conventions: NATS calls it publish, XADD adds (send).
_OPERATION_NAMES = {"kafka": "send", "rabbitmq": "publish", "nats": "publish"}


def relay_tracer(provider: Any | None = None) -> RelayTracer | None:
    """The relay's tracer, or None (tracing off) without the ``otel`` extra, or when neither
    ``provider`` nor OpenTelemetry's global tracer provider is a real (SDK) provider."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = provider if provider is not None else trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    from relayer import __version__

    return RelayTracer(provider.get_tracer("relayer", __version__))


def messaging_system(transport: Transport) -> str:
    """``messaging.system`` of a transport: its ``messaging_system`` attribute (the built-in
    broker transports have one), else its configured name."""
    system = getattr(transport, "messaging_system", None)
    return system if isinstance(system, str) and system else transport.name


class RelayTracer:
    """Creates the relay's spans; see the module docstring."""

    def __init__(self, tracer: Tracer) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        self.propagator = TraceContextTextMapPropagator()

    @contextlib.contextmanager
    def batch(
        self,
        store: str,
        lanes: Sequence[int],
        routing: Routing,
    ) -> Iterator[BatchTrace]:
        """The span of one batch (one transaction over one or more lanes), current while the
        batch runs (its log lines carry its ids; send spans link to it)."""
        with self.tracer.start_as_current_span(
            "relayer batch",
            attributes={"relayer.store": store, "relayer.lanes": list(lanes)},
            record_exception=True,
        ) as span:
            yield BatchTrace(self, span, routing)

    def writer_context(self, headers: Mapping[str, str]) -> Context | None:
        """The writer's span context stored in ``headers``, if present and sampled."""
        if TRACEPARENT not in headers:
            return None
        from opentelemetry import trace

        context = self.propagator.extract(headers)
        if not trace.get_current_span(context).get_span_context().trace_flags.sampled:
            return None
        return context


class BatchTrace:
    """What one traced batch did, told by the relay as it goes; ``finish`` makes the spans."""

    def __init__(
        self,
        tracer: RelayTracer,
        span: Span,
        routing: Routing,
    ) -> None:
        self.tracer = tracer
        self.span = span
        self.routing = routing
        self.rows: LaneRows | None = None
        self.report: SendReport | None = None
        self.contexts: dict[int, Context] = {}  # sampled row -> its writer's context
        self.acked: frozenset[int] = frozenset()
        self.parked: frozenset[int] = frozenset()
        self.gave_up = 0
        # (outcome, error type, description) when the batch rolled back.
        self.rollback: tuple[str, str, str] | None = None

    def sending(self, rows: LaneRows, indexes: Sequence[int]) -> SendReport:
        """The report for the send pipeline of ``indexes``: it times the sampled rows."""
        headers = rows.batch.headers
        writer_context = self.tracer.writer_context
        contexts: dict[int, Context] = {}
        for index in indexes:
            row_headers = headers[index]
            if row_headers and TRACEPARENT in row_headers:
                context = writer_context(row_headers)
                if context is not None:
                    contexts[index] = context
        self.rows = rows
        self.contexts = contexts
        self.report = SendReport(len(rows), contexts.keys())
        return self.report

    def recorded(self, acked: Sequence[int], parked: Sequence[int], gave_up: int) -> None:
        """The batch committed: ``acked`` rows deleted, the keys of ``parked`` rows parked."""
        self.acked = frozenset(acked)
        self.parked = frozenset(parked)
        self.gave_up = gave_up

    def rolled_back(self, error: BaseException) -> None:
        """The batch rolled back: its deadline passed (TimeoutError) or the database failed."""
        if isinstance(error, TimeoutError):
            self.rollback = ("deadline", TIMEOUT, "batch deadline passed; rolled back")
        else:
            self.rollback = ("failed", error_type(error), redact(str(error)))

    def finish(self, results: Sequence[ScanResult]) -> None:
        """Make the send spans of the sampled rows, then record how the batch ended."""
        if self.contexts:
            self._send_spans()
        self._batch_result(results)

    # -- spans ---------------------------------------------------------------------------------

    def _send_spans(self) -> None:
        from opentelemetry import trace

        rows, report = self.rows, self.report
        assert rows is not None and report is not None
        batch = self.span.get_span_context()
        links = [trace.Link(batch)] if batch.is_valid else None
        now = time.time_ns()
        for index, parent in self.contexts.items():
            outcome = self._outcome(index)
            if outcome is None:
                continue  # not tried in this batch: its next batch traces it
            name, kind, description = outcome
            name_of_transport = rows.transports[index] or self.routing.default
            transport = self.routing.transports.get(name_of_transport or "")
            system = messaging_system(transport) if transport is not None else "_OTHER"
            operation = _OPERATION_NAMES.get(system, "send")
            destination = rows.batch.destinations[index]
            attributes: dict[str, Any] = {
                "messaging.system": system,
                "messaging.operation.name": operation,
                "messaging.operation.type": "send",
                "messaging.destination.name": destination,
                "messaging.message.id": rows.batch.ids[index],
                "relayer.transport": name_of_transport or "",
                "relayer.outcome": name,
            }
            if system == "kafka":
                attributes["messaging.kafka.message.key"] = rows.batch.keys[index]
            if kind is not None:
                attributes["error.type"] = kind
            end = report.settled.get(index, now)
            span = self.tracer.tracer.start_span(
                f"{operation} {destination}",
                context=parent,
                kind=trace.SpanKind.PRODUCER,
                links=links,
                attributes=attributes,
                start_time=report.handed.get(index, end),
            )
            if kind is not None:
                span.set_status(trace.Status(trace.StatusCode.ERROR, redact(description)))
            span.end(end_time=end)

    def _outcome(self, index: int) -> tuple[str, str | None, str] | None:
        """(outcome, error.type or None, description) of a sampled row, or None if the batch
        did not try to send it."""
        report = self.report
        assert report is not None
        if index in report.down:
            return "unavailable", report.error_types.get(index), report.down[index]
        if index not in report.handed and index not in report.settled:
            return None
        if self.rollback is not None:
            return self.rollback
        if index in self.acked:
            return "sent", None, ""
        state = report.states[index]
        if index in self.parked:
            return "parked", report.error_types.get(index), report.failures[index][0]
        if state == IN_FLIGHT:
            return "deadline", TIMEOUT, _NO_ACKNOWLEDGEMENT
        if state == FAILED:  # the broker failed it too; its key's head is what is parked
            return "kept", report.error_types.get(index), report.failures[index][0]
        return "kept", None, ""

    def _batch_result(self, results: Sequence[ScanResult]) -> None:
        from opentelemetry.trace import Status, StatusCode

        report = self.report
        parked = sum(result.failed for result in results)
        result, kind, description = self._worst(results, parked)
        self.span.set_attributes(
            {
                "relayer.result": result,
                "relayer.sent": sum(result.sent for result in results),
                "relayer.parked": parked,
                "relayer.gave_up": self.gave_up,
                "relayer.unavailable": len(report.down) if report is not None else 0,
            }
        )
        if result in _ERRORS:
            self.span.set_attribute("error.type", kind or "_OTHER")
            self.span.set_status(Status(StatusCode.ERROR, redact(description)))

    def _worst(self, results: Sequence[ScanResult], parked: int) -> tuple[str, str | None, str]:
        """The batch's most telling result, with an error type and description for errors."""
        if self.rollback is not None:
            return self.rollback
        report = self.report
        if report is not None:
            if IN_FLIGHT in report.states:
                return "deadline", TIMEOUT, _NO_ACKNOWLEDGEMENT
            if report.down:
                index = next(iter(report.down))
                return "unavailable", report.error_types.get(index), report.down[index]
            if parked:
                index = min(self.parked or report.failures)
                error = report.failures[index][0]
                return "parked", report.error_types.get(index), f"{parked} row(s) parked: {error}"
        scans = {result.scan.value for result in results}
        for name in _BATCH_RESULTS[4:]:
            if name in scans:
                return name, None, ""
        return "empty", None, ""
