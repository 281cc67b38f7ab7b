"""An acknowledgement that says where the broker put a message, or none at all.

librdkafka reports a message delivered, without an error, in one case where the answer to
its request says nothing was stored by it: a DUPLICATE_SEQUENCE_NUMBER answer ("the previous
send succeeded but was not acknowledged"). It turns that answer into success and gives the
request's messages the answer's base offset, counting up: -1, 0, 1... for a broker that
answers an error with offset -1 (confluent-kafka shows the negative ones as ``None``). That
the earlier send stored the messages then rests on the broker's bookkeeping alone; a broker
whose idempotence state runs ahead of its log (the embedded broker tansu saves a producer's
sequence before it writes the batch) would have lost them without a word.

So a report is taken as an acknowledgement only if it places the message: an offset, after
the last one this producer had acknowledged on that partition. A report without one, the
reports that count up from it in the same answer, and a report at or before the partition's
last acknowledged offset are *unplaced*: the row stays in the outbox and is sent again (a
possible duplicate, never a loss), and the transport says so in a warning. A partition whose
log really went back (truncated by an unclean leader election, or deleted and created again)
costs one resend: its new offsets are the baseline after the first of them.
"""

from __future__ import annotations

from typing import Any


class Placements:
    """The last offset one producer had acknowledged on each (topic, partition); used by its
    poll thread only."""

    __slots__ = ("_last", "_run")

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], int] = {}
        # (topic, partition) -> the offset the next report of an unplaced answer would carry.
        self._run: dict[tuple[str, int], int] = {}

    def placed(self, report: Any) -> bool:
        """Whether the successful delivery report ``report`` (a confluent_kafka Message)
        places its message after every earlier one of this producer on its partition."""
        offset = report.offset()
        partition = (report.topic(), report.partition())
        run = self._run
        if offset is None:  # negative: the answer gave no place
            run[partition] = 0  # an answer at -1 counts up to 0, 1... for its other messages
            return False
        if run:
            expected = run.pop(partition, None)
            if expected is not None and offset == expected:
                run[partition] = offset + 1
                return False
        last = self._last.get(partition)
        self._last[partition] = offset
        return last is None or offset > last
