"""relayer.observability.throttle: one line per cause per interval, with the count of what was
held back."""

from __future__ import annotations

import logging
import sys

import pytest

from relayer.observability.logs import RedactingFilter, TextFormatter
from relayer.observability.throttle import ForeignLogFilter, ThrottledLog, shape


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def throttled(clock: Clock, caplog: pytest.LogCaptureFixture) -> ThrottledLog:
    caplog.set_level(logging.DEBUG, logger="relayer.test_throttle")
    return ThrottledLog(logging.getLogger("relayer.test_throttle"), 30.0, clock=clock)


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_a_cause_logs_once_per_interval_then_says_how_many_it_held_back(
    throttled: ThrottledLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    for lane in range(100):
        throttled.warning(("rollback",), "lane %s rolled back", lane, extra={"action": "rollback"})
        clock.now += 0.1  # 100 lines in 10 s
    assert lines(caplog) == ["lane 0 rolled back"]
    clock.now += 20.5
    throttled.warning(("rollback",), "lane %s rolled back", 7, extra={"action": "rollback"})
    assert lines(caplog)[1] == "lane 7 rolled back (99 more like it in the last 31 s)"
    record = caplog.records[1]
    assert record.action == "rollback"  # type: ignore[attr-defined]
    assert record.suppressed == 99  # type: ignore[attr-defined]
    assert record.levelno == logging.WARNING


def test_causes_are_throttled_apart(
    throttled: ThrottledLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(5):
        throttled.warning("database", "database down")
        throttled.error("broker", "broker down")
        clock.now += 1
    assert lines(caplog) == ["database down", "broker down"]
    assert [record.levelno for record in caplog.records] == [logging.WARNING, logging.ERROR]


def test_flush_due_writes_the_count_of_a_cause_that_stopped(
    throttled: ThrottledLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    for attempt in range(4):
        throttled.warning("heartbeat", "heartbeat %s failed", attempt)
    throttled.flush_due()  # the interval has not ended: nothing yet
    assert lines(caplog) == ["heartbeat 0 failed"]
    clock.now += 30
    throttled.flush_due()
    assert lines(caplog)[1:] == ["heartbeat 3 failed (2 more like it in the last 30 s)"]
    throttled.flush_due()
    clock.now += 60
    throttled.flush_due()  # nothing held since
    assert len(caplog.records) == 2


def test_flush_writes_everything_held_back(
    throttled: ThrottledLog, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    throttled.warning("a", "first a")
    throttled.warning("a", "second a")
    throttled.warning("b", "only b")
    clock.now += 5
    throttled.flush()
    assert lines(caplog) == ["first a", "only b", "second a"]  # nothing more than was held
    throttled.warning("a", "after the flush")  # a fresh start
    assert lines(caplog)[-1] == "after the flush"


def test_a_disabled_level_costs_no_cause(
    throttled: ThrottledLog, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="relayer.test_throttle")
    throttled.warning("x", "not shown")
    caplog.set_level(logging.DEBUG, logger="relayer.test_throttle")
    throttled.warning("x", "shown")
    assert lines(caplog) == ["shown"]


def test_the_number_of_causes_is_bounded(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="relayer.test_throttle")
    throttled = ThrottledLog(logging.getLogger("relayer.test_throttle"), clock=clock, causes=3)
    for number in range(10):
        throttled.info(number, "cause %s", number)
        clock.now += 1
    throttled.info(9, "cause 9 again")
    assert len(caplog.records) == 10  # all distinct, the last one still throttled


def test_shape_makes_numbers_and_ids_one_cause() -> None:
    assert shape("lane 3: connect to 127.0.0.1:5432 failed") == shape(
        "lane 12: connect to 127.0.0.1:6543 failed"
    )
    assert shape("copy of message 0190d2c4-6a1e-7c3b-9f00-5d1e2a3b4c5d waits") == (
        "copy of message # waits"
    )
    assert shape("database down") != shape("lease lost")


def record(
    name: str, level: int, message: str, exc: BaseException | None = None
) -> logging.LogRecord:
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(name, level, __file__, 1, message, None, info)


def test_foreign_lines_are_limited_and_lose_their_traceback_below_error(clock: Clock) -> None:
    foreign = ForeignLogFilter(30.0, clock=clock)
    try:
        raise ConnectionResetError("Connection reset by peer")
    except ConnectionResetError as exc:
        error = exc
    first = record("aiormq.connection", logging.WARNING, "reader exited", error)
    assert foreign.filter(first)
    assert first.exc_info is None
    assert first.getMessage() == "reader exited: ConnectionResetError: Connection reset by peer"
    assert not foreign.filter(record("aiormq.connection", logging.WARNING, "reader exited"))
    clock.now += 31
    later = record("aiormq.connection", logging.WARNING, "reader exited")
    assert foreign.filter(later)
    assert later.getMessage() == "reader exited (1 more like it in the last 31 s)"
    crash = record("asyncio", logging.ERROR, "Future exception was never retrieved", error)
    assert foreign.filter(crash)
    assert crash.exc_info is not None  # an error keeps its traceback (it may be a bug)
    assert foreign.filter(record("relayer.worker", logging.WARNING, "reader exited"))
    assert foreign.filter(record("relayer.worker", logging.WARNING, "reader exited"))


def test_a_message_with_line_breaks_is_logged_on_one_line() -> None:
    entry = record(
        "relayer.worker",
        logging.WARNING,
        "lane 3: server closed the connection unexpectedly\n\tThis probably means the server",
    )
    entry.error = "first\n  second"  # type: ignore[attr-defined]
    assert RedactingFilter().filter(entry)
    text = TextFormatter().format(entry)
    assert "\n" not in text
    assert "unexpectedly This probably means" in text
    assert "error=first second" in text


def test_the_cli_handler_limits_foreign_lines() -> None:
    from relayer.observability.logs import configure

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("INFO")
        (handler,) = root.handlers
        assert any(isinstance(f, ForeignLogFilter) for f in handler.filters)
        assert logging.getLogger("aiormq").getEffectiveLevel() == logging.ERROR
        assert handler.stream is sys.stderr
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger("aiormq").setLevel(logging.NOTSET)
        logging.getLogger("psycopg").setLevel(logging.NOTSET)
        logging.getLogger("relayer").setLevel(logging.NOTSET)
