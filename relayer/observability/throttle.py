"""Rate-limited logging: one line per cause per interval, with a count of what was held back.

A broker or database that is down makes the same thing go wrong many times a second (every
lane, every batch, every reconnect). Each place that can repeat a warning logs it through a
:class:`ThrottledLog` with a *cause*: a hashable that says "the same problem" (the action, the
store, the transport, the kind of error...). The first line of a cause goes out at once; later
ones within ``interval`` seconds are held back and counted. The first line of that cause after
the interval goes out with the count, in the text and in the ``suppressed`` field. A cause that
stops repeating gets its count out too: ``flush_due`` (called now and then by the worker and the
Kafka poll thread) writes the last held-back line of each cause whose interval has ended, and
``flush`` (when a transport or store shuts down) that of every cause.

The throttle is safe to call from other threads (librdkafka's callbacks run in the poll
thread) and remembers at most ``causes`` causes (the quietest are forgotten first).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

# Seconds between two lines of one cause (docs/observability.md, "Repeated warnings").
LOG_INTERVAL = 30.0

_VARIABLE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F-]{27}|\d+")


def shape(text: str) -> str:
    """``text`` with its numbers and UUIDs replaced: errors that differ only in a lane, a
    port, a count or a message id are one cause."""
    return _VARIABLE.sub("#", text)


# One line to log: level, message, its arguments, the structured fields.
_Line = tuple[int, str, tuple[Any, ...], Mapping[str, Any] | None]


@dataclass(slots=True)
class _Cause:
    since: float  # when its last line went out
    held: int = 0  # lines held back since then
    last: _Line | None = None  # the latest of them


class ThrottledLog:
    """A logger's warnings, at most one line per cause per ``interval``. See the module
    docstring."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = LOG_INTERVAL,
        *,
        clock: Callable[[], float] = time.monotonic,
        causes: int = 1024,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._limit = causes
        self._causes: dict[Hashable, _Cause] = {}
        # The earliest end of an interval in which lines were held back (for flush_due).
        self._next_due: float | None = None
        self._lock = threading.Lock()

    def warning(
        self, cause: Hashable, message: str, *args: Any, extra: Mapping[str, Any] | None = None
    ) -> None:
        self.log(logging.WARNING, cause, message, *args, extra=extra)

    def error(
        self, cause: Hashable, message: str, *args: Any, extra: Mapping[str, Any] | None = None
    ) -> None:
        self.log(logging.ERROR, cause, message, *args, extra=extra)

    def info(
        self, cause: Hashable, message: str, *args: Any, extra: Mapping[str, Any] | None = None
    ) -> None:
        self.log(logging.INFO, cause, message, *args, extra=extra)

    def log(
        self,
        level: int,
        cause: Hashable,
        message: str,
        *args: Any,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Log ``message % args`` now, or count it against ``cause`` if a line of that cause
        went out less than ``interval`` seconds ago."""
        if not self.logger.isEnabledFor(level):
            return
        line: _Line = (level, message, args, extra)
        now = self._clock()
        with self._lock:
            state = self._causes.get(cause)
            if state is not None and now - state.since < self.interval:
                state.held += 1
                state.last = line
                self._due_at(state.since + self.interval)
                return
            held, since = (state.held, state.since) if state is not None else (0, now)
            if state is None and len(self._causes) >= self._limit:
                self._forget_quietest()
            self._causes[cause] = _Cause(now)
        self._emit(line, held, now - since)

    def flush_due(self) -> None:
        """Write the last held-back line of each cause whose interval has ended, with its
        count (called now and then: a cause that stopped repeating still gets its count out
        within about an interval)."""
        if self._next_due is None or self._clock() < self._next_due:
            return
        self._flush(everything=False)

    def flush(self) -> None:
        """Write the last held-back line of every cause, with its count, and start afresh (at
        shutdown)."""
        self._flush(everything=True)

    def _flush(self, *, everything: bool) -> None:
        now = self._clock()
        pending: list[tuple[_Line, int, float]] = []
        with self._lock:
            self._next_due = None
            for state in self._causes.values():
                if not state.held or state.last is None:
                    continue
                if everything or now - state.since >= self.interval:
                    pending.append((state.last, state.held - 1, now - state.since))
                    state.since, state.held, state.last = now, 0, None
                else:
                    self._due_at(state.since + self.interval)
            if everything:
                self._causes.clear()
        for line, held, elapsed in pending:
            self._emit(line, held, elapsed)

    def _due_at(self, when: float) -> None:
        if self._next_due is None or when < self._next_due:
            self._next_due = when

    def _emit(self, line: _Line, held: int, elapsed: float) -> None:
        level, message, args, extra = line
        if held > 0:
            message = f"{message} (%d more like it in the last %.0f s)"
            args = (*args, held, elapsed)
            extra = {**(extra or {}), "suppressed": held}
        self.logger.log(level, message, *args, extra=extra)

    def _forget_quietest(self) -> None:
        oldest = min(self._causes, key=lambda cause: self._causes[cause].since)
        del self._causes[oldest]


class ForeignLogFilter(logging.Filter):
    """For a handler: lines of other libraries (asyncio, aiormq...) at most once per logger,
    message template and ``interval``; below ERROR, a traceback is shortened to its last line.
    relayer's own lines are throttled where they are logged and pass unchanged."""

    def __init__(
        self, interval: float = LOG_INTERVAL, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._causes: dict[tuple[str, str], _Cause] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "relayer" or record.name.startswith("relayer."):
            return True
        cause = (record.name, str(record.msg))
        now = self._clock()
        with self._lock:
            state = self._causes.get(cause)
            if state is not None and now - state.since < self.interval:
                state.held += 1
                return False
            if len(self._causes) >= 1024:
                self._causes.clear()
            self._causes[cause] = _Cause(now)
        text = record.getMessage()
        if record.exc_info and record.levelno < logging.ERROR:
            error = record.exc_info[1]
            if error is not None:
                text = f"{text}: {type(error).__name__}: {error}"
            record.exc_info = None
            record.exc_text = None
        if state is not None and state.held:
            text = f"{text} ({state.held} more like it in the last {now - state.since:.0f} s)"
            record.suppressed = state.held
        record.msg = text
        record.args = None
        return True
