"""A delivery report's way from the poll thread to the callback that settles its message.

Every message handed to the producer carries a *target*, ``(settle, index, message id)``: the
relay's settle callback and the row's index in its batch, or, for ``publish()``, a callback
that resolves the message's future. librdkafka calls :func:`record_report` in the poll thread,
inside ``producer.poll()``; it only collects the report (after the placement check of
relayer.transports.kafka.placement). The poll thread hands what one poll collected to the
event loop in one call, where :class:`Deliveries` settles each message: None for an
acknowledgement, TransportUnavailableError for a message the producer dropped or an
acknowledgement that placed nothing (the row is sent again), else the SendError of
relayer.transports.kafka.rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

from relayer.observability.throttle import ThrottledLog
from relayer.transports.base import Settle, TransportUnavailableError
from relayer.transports.kafka.placement import Placements
from relayer.transports.kafka.rules import delivery_error
from relayer.transports.kafka.stall import Generation
from relayer.transports.stalls import StallNotice

# Whom a message's report settles: (settle, index, message id). Its last item is the message id
# (the chaos suite's recorder, tests/chaos/recorder, reads it there).
Target = tuple[Settle, int, str]
# (target, error or None or UNPLACED, the report), in the order librdkafka reported them.
Reports = list[tuple[Target, Any, Any]]

# A successful report that does not place its message (relayer.transports.kafka.placement):
# what the poll thread records instead of no error, for the loop to resend the row.
UNPLACED: Any = object()
# Delivery reports of messages dropped by a purge or a fatal error: nothing wrong with them.
_NOT_SENT = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError._FATAL})


def record_report(
    reports: Reports,
    placements: Placements,
    target: Target,
    error: Any,
    report: Any,
) -> None:
    """A message's ``on_delivery`` callback (bound to all but its last two arguments)."""
    # Runs in the poll thread, inside producer.poll(): only collect; the loop settles.
    if error is not None:
        reports.append((target, error, report))
    elif placements.placed(report):
        reports.append((target, None, None))
    else:
        reports.append((target, UNPLACED, report))


class Deliveries:
    """Settles the reports the poll thread hands over, on the event loop's thread."""

    def __init__(
        self,
        *,
        path: str,
        store: str | None,
        log: ThrottledLog,
        notice: StallNotice,
        max_bytes: int,
        freed: Callable[[], None],
    ) -> None:
        """``path``, ``store``: how log lines name the transport; ``freed``: called after each
        hand-over, whose messages left librdkafka's local queue (backpressure)."""
        self._path = path
        self._store = store
        self._log = log
        self._notice = notice
        self._max_bytes = max_bytes
        self._freed = freed

    def settle(self, generation: Generation, reports: Reports) -> None:
        """Settle each message of ``reports`` (reported by ``generation``'s producer)."""
        waiting = generation.waiting
        dropped: TransportUnavailableError | None = None
        unplaced: list[Any] = []
        if self._notice.since is not None and any(error is None for _, error, _ in reports):
            self._notice.acknowledged()
        for (settle, index, message_id), error, report in reports:
            waiting.discard(message_id)
            if error is None:
                settle(index, None)
            elif error is UNPLACED:
                unplaced.append(report)
                settle(index, _unplaced(report))
            elif error.code() in _NOT_SENT:
                if dropped is None:
                    dropped = TransportUnavailableError(
                        f"the Kafka producer dropped the message unacknowledged "
                        f"({error.str()}): it was closed or hit a fatal error; the message "
                        "will be sent again"
                    )
                settle(index, dropped)
            else:
                settle(index, delivery_error(error, report, self._max_bytes))
        if unplaced:
            self._warn_unplaced(unplaced)
        self._freed()

    def _warn_unplaced(self, reports: list[Any]) -> None:
        """Reports of success that placed nothing (relayer.transports.kafka.placement)."""
        self._log.warning(
            "unplaced",
            "%s: Kafka reported %s message(s) delivered without placing them (the first %s: "
            "librdkafka's success for a DUPLICATE_SEQUENCE_NUMBER answer); their rows stay and "
            "are sent again; if this repeats, check the brokers' logs for lost producer state",
            self._path,
            len(reports),
            _place(reports[0]),
            extra={"action": "transport_unplaced", "store": self._store},
        )


def _place(report: Any) -> str:
    """Where an unplaced report put its message, in words."""
    offset = report.offset()
    where = f"to {report.topic()} [{report.partition()}]"
    if offset is None:
        return f"{where} without an offset"
    return f"{where} at offset {offset}, counting up from an answer without one"


def _unplaced(report: Any) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"Kafka reported the message delivered {_place(report)}, so relayer cannot tell that "
        "the broker stored it; it will be sent again"
    )
