"""What a transport says about a broker that stopped acknowledging (a silent stall: the
connections stay open, nothing is confirmed, nothing fails).

A stalled broker is not the rows' fault: the relay keeps their rows, counts no attempt and
tries the lanes again. The transport refuses a second copy of a message whose first copy
still waits (so a long stall piles nothing up), and that refusal is the moment to tell the
operator, once: the relay gave up waiting for the broker within a batch deadline. When the
broker acknowledges again, one more line says how long it was silent.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)

# A refusal while the broker acknowledged something this recently is the tail of a stall that
# just ended (copies resent while the first ones are still being acknowledged), not news.
QUIET_SECONDS = 1.0


class StallNotice:
    """One warning per stall and one line when it is over, for one transport. Called on the
    event loop's thread."""

    __slots__ = ("_advice", "_broker", "_logger", "_name", "since")

    def __init__(self, log: logging.Logger, name: str, broker: str, advice: str) -> None:
        self._logger = log
        self._name = name
        self._broker = broker  # "RabbitMQ", "Kafka": how the lines name the broker
        self._advice = advice  # what to check, ending the warning
        self.since: float | None = None  # the stall is known since this monotonic time

    def refused(self, waiting: int, quiet_since: float) -> None:
        """A copy was refused because an earlier one still waits; ``quiet_since``: when the
        broker last acknowledged anything (or nothing waited)."""
        if self.since is not None or time.monotonic() - quiet_since < QUIET_SECONDS:
            return
        self.since = quiet_since
        self._logger.warning(
            "%s transport %s: %s message(s) wait for the broker's acknowledgement and none came "
            "for %.0f s: %s is slow or stalled; their rows wait and are sent again once it "
            "answers, no attempt is counted; %s",
            self._broker,
            self._name,
            waiting,
            time.monotonic() - quiet_since,
            self._broker,
            self._advice,
            extra={"action": "transport_stall"},
        )

    def acknowledged(self) -> None:
        """The broker acknowledged a message: a stall (if one was said) is over."""
        since, self.since = self.since, None
        if since is None:
            return
        self._logger.info(
            "%s transport %s: the broker acknowledges again after %.0f s",
            self._broker,
            self._name,
            time.monotonic() - since,
            extra={"action": "transport_stall_over"},
        )
