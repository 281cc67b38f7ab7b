"""Logging set-up for the CLI: text or JSON lines, with secrets redacted.

Library modules only call ``logging.getLogger(__name__)`` with lazy arguments and structured
extras; only the CLI (or the embedding application) configures handlers. The structured fields
are a small vocabulary: ``action``, ``store``, ``lane``, ``batch``, ``member``, ``queue``,
``key``, ``rows``, ``error``, ``suppressed`` (lines of the same cause held back, see
relayer.observability.throttle); docs/observability.md lists every ``action`` value. An embedding
application can reuse ``RedactingFilter`` and ``JsonFormatter`` on its own handlers.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

from relayer.observability.throttle import ForeignLogFilter
from relayer.observability.tracing import current_trace_ids
from relayer.redact import MASK, is_secret_name, redact

FIELDS = (
    "action",
    "store",
    "lane",
    "batch",
    "member",
    "queue",
    "key",
    "rows",
    "error",
    "suppressed",
)

# A quoted name and a quoted value, as in a dict repr, JSON or a tuple: 'sasl.password': 'x'.
_QUOTED_PAIR = re.compile(
    r"""(?P<head>(?P<q>['"])(?P<name>[^'"\n]{1,100})(?P=q)\s*[:,=]\s*)"""
    r"""(?P<secret>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
)
# name: value, as in YAML-ish text or an exception message ("password: hunter2").
_COLON_PAIR = re.compile(
    r"(?P<head>\b(?:password|passwd|secret|token|api[_-]?key)\s*:\s*)(?P<secret>[^\s,;'\"]+)",
    re.IGNORECASE,
)


def scrub(text: str) -> str:
    """``redact`` plus the shapes a log line adds: quoted name/value pairs of secret-named
    settings and ``password: value``."""

    def quoted(match: re.Match[str]) -> str:
        if not is_secret_name(match["name"]):
            return match[0]
        quote = match["secret"][0]
        return f"{match['head']}{quote}{MASK}{quote}"

    text = _QUOTED_PAIR.sub(quoted, redact(text))
    return _COLON_PAIR.sub(lambda m: m["head"] + MASK, text)


# A line break and the indentation after it, as in libpq's "server closed the connection
# unexpectedly\n\tThis probably means...": one log record must stay one line.
_BREAK = re.compile(r"\s*\n\s*")


class RedactingFilter(logging.Filter):
    """Renders the message once, on one line, and removes anything password-like from it and
    its fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = _one_line(record.getMessage())
        record.args = None
        for name in FIELDS:
            value = getattr(record, name, None)
            if isinstance(value, str):
                setattr(record, name, _one_line(value))
            elif value is not None and not isinstance(value, int | float):
                setattr(record, name, _one_line(str(value)))  # an exception or a mapping
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        return True


def _one_line(text: str) -> str:
    return scrub(_BREAK.sub(" ", text.strip()))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the structured fields, and
    ``trace_id``/``span_id`` while an OpenTelemetry span is active (a relay batch's, say)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        ids = _trace_ids(record)
        if ids is not None:
            entry["trace_id"], entry["span_id"] = ids
        if record.exc_info:
            entry["exception"] = scrub(self.formatException(record.exc_info))
        return json.dumps(entry, default=lambda value: scrub(str(value)))


def _trace_ids(record: logging.LogRecord) -> tuple[str, str] | None:
    """The ids OpenTelemetry's logging instrumentation put on the record (it may be formatted
    later, elsewhere), else those of the span active now, in the thread that logs."""
    trace_id = getattr(record, "otelTraceID", None)
    span_id = getattr(record, "otelSpanID", None)
    if isinstance(trace_id, str) and isinstance(span_id, str) and trace_id.strip("0"):
        return trace_id, span_id
    return current_trace_ids()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = [
            f"{name}={getattr(record, name)}"
            for name in FIELDS
            if getattr(record, name, None) is not None
        ]
        return f"{text} [{' '.join(fields)}]" if fields else text

    def formatException(self, ei: Any) -> str:
        return scrub(super().formatException(ei))


def configure(level: str = "INFO", log_format: str = "text") -> None:
    """Send relayer's logs to stderr in the chosen format (called by the CLI only)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ForeignLogFilter())  # first: the redacting filter sees what it added
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("relayer").setLevel(level)
    # The drivers warn about each connection they lose (aiormq with a traceback); relayer
    # reports the same failures itself, with what to do, once per interval.
    logging.getLogger("aiormq").setLevel(logging.ERROR)
    logging.getLogger("psycopg").setLevel(logging.ERROR)
