"""An acknowledgement that says where the broker put a message, or none at all.

librdkafka reports a message delivered, without an error, in one case where the answer to
its request says nothing was stored by it: a DUPLICATE_SEQUENCE_NUMBER answer ("the previous
send succeeded but was not acknowledged"). It turns that answer into success and gives the
request's messages the answer's base offset, counting up: -1, 0, 1... for a broker that
answers an error with offset -1 (confluent-kafka shows the negative ones as ``None``). That
the earlier send stored the messages then rests on the broker's bookkeeping alone; a broker
whose idempotence state runs ahead of its log (the embedded broker tansu saves a producer's
sequence before it writes the batch) would have lost them without a word.

So a report is taken as an acknowledgement only if it places the message at an offset. A
report without one, and the reports that count up from it on its partition (the rest of the
same answer: librdkafka hands a request's reports over together, in order), are *unplaced*:
the row stays in the outbox and is sent again (a possible duplicate, never a loss), and the
transport says so in a warning. A placed report costs one call and one test.
"""

from __future__ import annotations

from typing import Any


class Placements:
    """The unplaced answers of one producer, by (topic, partition); used by its poll thread
    only."""

    __slots__ = ("_run",)

    def __init__(self) -> None:
        # (topic, partition) -> the offset the next report of an unplaced answer would carry.
        self._run: dict[tuple[str, int], int] = {}

    def placed(self, report: Any) -> bool:
        """Whether the successful delivery report ``report`` (a confluent_kafka Message)
        places its message: it has an offset, and does not continue an answer that had none."""
        offset = report.offset()
        run = self._run
        if offset is not None and not run:
            return True
        partition = (report.topic(), report.partition())
        if offset is None:  # negative: the answer gave no place
            run[partition] = 0  # an answer at -1 counts up to 0, 1... for its other messages
            return False
        expected = run.pop(partition, None)
        if expected is not None and offset == expected:
            run[partition] = offset + 1
            return False
        return True
