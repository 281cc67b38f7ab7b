"""Logging set-up for the CLI: text or JSON lines, with secrets redacted.

Library modules only call ``logging.getLogger(__name__)`` with lazy arguments and structured
extras; only the CLI (or the embedding application) configures handlers. The structured fields
are a small vocabulary: ``action``, ``store``, ``lane``, ``batch``, ``member``, ``queue``,
``key``, ``rows``, ``error``.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from relayer.redact import redact

FIELDS = ("action", "store", "lane", "batch", "member", "queue", "key", "rows", "error")


class RedactingFilter(logging.Filter):
    """Renders the message once and removes anything password-like from it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact(record.getMessage())
        record.args = None
        for name in FIELDS:
            value = getattr(record, name, None)
            if isinstance(value, str):
                setattr(record, name, redact(value))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the structured fields."""

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
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


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
        return redact(super().formatException(ei))


def configure(level: str = "INFO", log_format: str = "text") -> None:
    """Send relayer's logs to stderr in the chosen format (called by the CLI only)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("relayer").setLevel(level)
