"""OpenTelemetry tracing (the ``otel`` extra), off unless an SDK tracer provider is configured.

Writer: ``with_trace_context`` adds the W3C ``traceparent`` (and ``tracestate``) of the active
span to a message's headers, unless the caller set them. It imports nothing: if the application
never imported ``opentelemetry.trace``, no span can be active and the headers pass unchanged.

Relay: ``relay_tracer`` returns None without the extra or without a configured provider, and the
relay then does no tracing work at all. Otherwise each lane batch gets one ``relayer batch`` span
(a root: a batch serves many requests), and each message whose stored ``traceparent`` is sampled
gets a PRODUCER ``send <destination>`` span, child of the writer's span and linked to its batch,
from publish to acknowledgement. Unsampled or untraced rows get no per-message span: a span per
row would cost more than the publish itself. Headers reach the broker unchanged, so a consumer
that extracts ``traceparent`` continues the writer's trace.

Only this module imports opentelemetry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
from collections.abc import Awaitable, Coroutine, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from relayer.redact import redact

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from relayer.relay import ScanResult
    from relayer.transports.base import OutgoingMessage, Transport

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


def with_trace_context(headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``headers`` plus the W3C context of the active span, if there is one (writer side)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:  # never imported by the application: no span can be active
        return headers
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return headers
    if headers and any(name.lower() == TRACEPARENT for name in headers):
        return headers  # the caller propagates a context of its own choosing
    traced = dict(headers) if headers else {}
    traced[TRACEPARENT] = f"00-{context.trace_id:032x}-{context.span_id:016x}-" + (
        f"{int(context.trace_flags):02x}"
    )
    state = context.trace_state.to_header() if context.trace_state else ""
    if state:
        traced[TRACESTATE] = state
    return traced


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
    from relayer import __version__  # not at import: the writer imports this module early

    return RelayTracer(provider.get_tracer("relayer", __version__))


class RelayTracer:
    """Creates the relay's spans; see the module docstring."""

    def __init__(self, tracer: Tracer) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        self.propagator = TraceContextTextMapPropagator()

    @contextlib.contextmanager
    def batch(self, store: str, lanes: Sequence[int]) -> Iterator[BatchSpan]:
        """The span of one batch (one transaction over one or more lanes), current while the
        batch runs (send spans link to it)."""
        with self.tracer.start_as_current_span(
            "relayer batch",
            attributes={"relayer.store": store, "relayer.lanes": list(lanes)},
            record_exception=True,
        ) as span:
            yield BatchSpan(span)

    def wrap(self, transports: Mapping[str, Transport]) -> dict[str, Transport]:
        """``transports`` with a send span around each publish of a sampled message."""
        return {name: TracedTransport(transport, self) for name, transport in transports.items()}

    def writer_context(self, headers: Mapping[str, str]) -> Context | None:
        """The writer's span context stored in ``headers``, if present and sampled."""
        if TRACEPARENT not in headers:
            return None
        from opentelemetry import trace

        context = self.propagator.extract(headers)
        if not trace.get_current_span(context).get_span_context().trace_flags.sampled:
            return None
        return context

    def start_send(self, message: OutgoingMessage, transport: str, parent: Context) -> Span:
        from opentelemetry import trace

        batch = trace.get_current_span().get_span_context()
        return self.tracer.start_span(
            f"send {message.destination}",
            context=parent,
            kind=trace.SpanKind.PRODUCER,
            links=[trace.Link(batch)] if batch.is_valid else None,
            attributes={
                "messaging.operation.type": "send",
                "messaging.destination.name": message.destination,
                "messaging.message.id": message.id_text,
                "relayer.transport": transport,
            },
        )


class BatchSpan:
    """The batch span's handle for the relay: it records how the batch ended."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def finish(self, results: Sequence[ScanResult]) -> None:
        """Record how the batch ended: its lanes' results (the most telling one: trouble
        first, then progress), and the rows sent and failed over all its lanes."""
        from opentelemetry.trace import Status, StatusCode

        worst = min(results, key=lambda result: _TELLING.index(result.scan.value))
        self.span.set_attributes(
            {
                "relayer.result": worst.scan.value,
                "relayer.sent": sum(result.sent for result in results),
                "relayer.failed": sum(result.failed for result in results),
            }
        )
        if worst.scan.value in ("failed", "unavailable"):
            self.span.set_status(Status(StatusCode.ERROR, redact(worst.detail)))


# Scan results, the most telling first (a batch span reports the first one among its lanes).
_TELLING = ("failed", "unavailable", "sent", "busy", "future", "empty")


class TracedTransport:
    """A transport whose publishes of sampled messages are wrapped in send spans."""

    def __init__(self, inner: Transport, tracer: RelayTracer) -> None:
        self.inner = inner
        self.tracer = tracer

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def pipelines_within_key(self) -> bool:
        return self.inner.pipelines_within_key

    async def start(self) -> None:
        await self.inner.start()

    async def ordered_by_key(self, destination: str) -> bool:
        return await self.inner.ordered_by_key(destination)

    async def close(self) -> None:
        await self.inner.close()

    def publish(self, message: OutgoingMessage) -> Coroutine[Any, Any, Awaitable[None]]:
        # A plain method: an untraced row gets the inner transport's coroutine itself, without
        # a coroutine frame of ours around it.
        parent = self.tracer.writer_context(message.headers) if message.headers else None
        if parent is None:
            return self.inner.publish(message)
        return self._publish_traced(message, parent)

    async def _publish_traced(self, message: OutgoingMessage, parent: Context) -> Awaitable[None]:
        span = self.tracer.start_send(message, self.inner.name, parent)
        try:
            acknowledgement = await self.inner.publish(message)
        except BaseException as exc:
            _end(span, exc)
            raise
        future = (
            acknowledgement
            if isinstance(acknowledgement, asyncio.Future)
            else asyncio.ensure_future(acknowledgement)
        )
        if future.done():
            _settled(span, future)
        else:
            future.add_done_callback(functools.partial(_settled, span))
        return future


def _settled(span: Span, future: asyncio.Future[None]) -> None:
    if future.cancelled():
        _end(span, asyncio.CancelledError())
    else:
        _end(span, future.exception())


def _end(span: Span, error: BaseException | None) -> None:
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        description = redact(f"{type(error).__name__}: {error}")
        span.set_status(Status(StatusCode.ERROR, description))
    span.end()
