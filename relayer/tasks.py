"""Small helpers for the futures and tasks of the relay's coalescing batchers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


def fail_all(futures: Iterable[asyncio.Future[Any]], exc: BaseException) -> None:
    """Fail each future not done yet with ``exc`` (a cancellation becomes a RuntimeError, so
    that waiters see a failure rather than being cancelled themselves)."""
    error = exc if isinstance(exc, Exception) else RuntimeError("cancelled")
    for future in futures:
        if not future.done():
            future.set_exception(error)


async def cancel_all(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel ``tasks`` and wait until each has ended, whatever it ended with."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(BaseException):
            await task
