"""Operator changes of a store's dispatch queues, as ``relayer queue`` and the dashboard make
them: a concurrency limit read as an operator types it, and a pause, resume or limit written
with its audit row (the statements: relayer.dispatch.control.QueueControl)."""

from __future__ import annotations

from relayer.dispatch.control import (
    LIMIT_RULE,
    QueueControl,
    check_limit,
    require_dispatch_schema,
)
from relayer.errors import ConfigurationError
from relayer.settings import StoreSettings
from relayer.store.driver import Connection

# The rule as an operator reads it where a limit is typed (a flag or a form field).
TYPED_LIMIT_RULE = LIMIT_RULE.replace("None ('none' on the command line)", "'none'")
QUEUE_ACTIONS = ("pause", "resume", "limit")


def parse_limit(text: str) -> int | None:
    """``N`` (an integer from 1 to 2**31 - 1) or ``none``; anything else is a
    ConfigurationError."""
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        raise ConfigurationError("limit", text, TYPED_LIMIT_RULE) from None
    try:
        return check_limit(value)
    except ConfigurationError:
        raise ConfigurationError("limit", value, TYPED_LIMIT_RULE) from None


async def change_queue(
    conn: Connection,
    store: StoreSettings,
    action: str,
    *,
    queue: str | None,
    by: str,
    reason: str | None,
    limit: int | None = None,
) -> None:
    """``pause``/``resume`` ``queue`` (None: every queue, the '*' pause) or set its ``limit``
    (None: no cap), once the store's schema has the queue tables."""
    await require_dispatch_schema(conn, store)
    control = QueueControl(conn, store.names)
    if action == "pause":
        await control.pause(queue, reason=reason, by=by)
    elif action == "resume":
        await control.resume(queue, reason=reason, by=by)
    elif action == "limit":
        await control.set_limit(queue or store.name, check_limit(limit), reason=reason, by=by)
    else:
        raise ValueError(f"unknown queue action {action!r}")
