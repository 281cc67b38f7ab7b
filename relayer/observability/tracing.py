"""The writer's side of OpenTelemetry tracing: the W3C trace context of the active span.

``with_trace_context`` adds the W3C ``traceparent`` (and ``tracestate``) of the active span to a
message's headers, unless the caller set them; ``current_trace_ids`` is the same look-up for log
lines (relayer.observability.logs). Neither imports anything: if the application never imported
``opentelemetry.trace``, no span can be active and the headers pass unchanged. The relay's spans
are relayer.relay.trace's.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

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


def current_trace_ids() -> tuple[str, str] | None:
    """The active span's trace and span id (hex), or None; imports nothing (see above)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"
