"""The Kafka transport's one produce loop: rows handed to the current producer, in order.

``publish_batch`` (the relay's way) hands it the rows of a batch; ``publish`` (one message:
unordered rows, after-commit dispatch) hands it a batch of one row, :class:`OneMessage`, and
resolves its future from the settle callback. So both go through the same checks, in the same
order, for each row:

- a row whose earlier copy still waits in the producer (a stall) is refused, not queued behind
  it, so a long stall piles up no copies to deliver afterwards;
- its topic is looked up in the cluster's metadata once (:class:`Topics`);
- librdkafka's local queue being full is backpressure (:class:`QueueRoom`): the loop waits for
  deliveries to free space, unless the message alone is larger than the queue;
- a fatal error, or a producer replaced while the loop waited, raises
  TransportUnavailableError: the key's earlier messages died with the old producer, so its
  later ones must not reach the new one ahead of their resend.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException

from relayer.transports.base import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    OutgoingMessage,
    SendError,
    Settle,
    TransportUnavailableError,
)
from relayer.transports.kafka import deliveries
from relayer.transports.kafka.polling import PolledProducer, describe, rebuilding
from relayer.transports.kafka.rules import produce_error, topic_error
from relayer.transports.kafka.stall import Generation, in_thread
from relayer.transports.stalls import StallNotice

# A missing topic is looked up again after this long, so a topic created meanwhile is found.
_MISSING_TOPIC_SECONDS = 5.0
# The longest wait for room in a full local queue before trying again.
_ROOM_SECONDS = 0.1
_RESERVED = frozenset({MESSAGE_ID_HEADER, ORDERING_KEY_HEADER})


class Rows(Protocol):
    """Rows as columns, as in relayer.transports.base.OutboundBatch (whose keys are never
    None); the produce loop reads each column once per call."""

    @property
    def ids(self) -> Sequence[str]: ...
    @property
    def keys(self) -> Sequence[str | None]: ...
    @property
    def destinations(self) -> Sequence[str]: ...
    @property
    def bodies(self) -> Sequence[bytes]: ...
    @property
    def headers(self) -> Sequence[Mapping[str, str] | None]: ...
    def message(self, index: int) -> OutgoingMessage: ...


@dataclass(frozen=True, slots=True)
class OneMessage:
    """``publish()``'s message as rows: row 0."""

    only: OutgoingMessage

    @property
    def ids(self) -> tuple[str]:
        return (self.only.id_text,)

    @property
    def keys(self) -> tuple[str | None]:
        return (self.only.key,)

    @property
    def destinations(self) -> tuple[str]:
        return (self.only.destination,)

    @property
    def bodies(self) -> tuple[bytes]:
        return (self.only.body,)

    @property
    def headers(self) -> tuple[Mapping[str, str] | None]:
        return (self.only.headers or None,)

    def message(self, index: int) -> OutgoingMessage:
        return self.only


class QueueRoom:
    """Backpressure: a produce refused by librdkafka's full local queue waits here until a
    hand-over of delivery reports frees space (or briefly, then tries again)."""

    def __init__(self) -> None:
        self._space = asyncio.Event()
        self._waiting = 0

    async def wait(self) -> None:
        self._space.clear()
        self._waiting += 1
        try:
            async with asyncio.timeout(_ROOM_SECONDS):
                await self._space.wait()
        except TimeoutError:
            pass
        finally:
            self._waiting -= 1

    def freed(self) -> None:
        if self._waiting:
            self._space.set()


class Topics:
    """The topics the transport found in the cluster's metadata, and what is wrong with those
    it did not (remembered for a while, then looked up again)."""

    def __init__(self, producer: PolledProducer, metadata_timeout: float) -> None:
        self._producer = producer
        self._metadata_timeout = metadata_timeout
        self.known: set[str] = set()
        self._missing: dict[str, tuple[float, str]] = {}

    async def lookup(self, topic: str, *, use_cache: bool = False) -> str | None:
        """None if ``topic`` exists, else what is wrong and how to fix it.

        Raises TransportUnavailableError when the cluster does not answer in time.
        """
        if use_cache and topic in self._missing:
            since, remembered = self._missing[topic]
            if time.monotonic() - since < _MISSING_TOPIC_SECONDS:
                return remembered
        generation = self._producer.current()
        try:
            metadata = await in_thread(
                generation.producer.list_topics, topic, self._metadata_timeout
            )
        except KafkaException as exc:
            raise TransportUnavailableError(
                f"could not look up Kafka topic {topic!r} within {self._metadata_timeout:g} s: "
                f"{describe(exc)}; check that the cluster is reachable"
            ) from exc
        problem = topic_error(topic, metadata)
        if problem is None:
            self.known.add(topic)
            self._missing.pop(topic, None)
        else:
            self._missing[topic] = (time.monotonic(), problem)
        return problem


class ProduceLoop:
    """Hands rows to the current producer (see the module docstring)."""

    def __init__(
        self,
        producer: PolledProducer,
        topics: Topics,
        *,
        notice: StallNotice,
        room: QueueRoom,
        max_bytes: int,
    ) -> None:
        self._producer = producer
        self._topics = topics
        self._notice = notice
        self._room = room
        self._max_bytes = max_bytes

    async def hand_over(
        self, rows: Rows, indexes: Sequence[int], settle: Settle, admitting: Callable[[], bool]
    ) -> int:
        """The rows at ``indexes``, in order, as relayer.transports.base.BatchPublisher's
        ``publish_batch``: one produce call a row, settled from its delivery report."""
        generation = self._ready()
        ids, keys, topics = rows.ids, rows.keys, rows.destinations
        bodies, all_headers = rows.bodies, rows.headers
        known, waiting = self._topics.known, generation.waiting
        reports, placements = self._producer.reports, generation.placements
        record = deliveries.record_report  # looked up here: the chaos suite's recorder wraps it
        produce = generation.producer.produce
        handed = 0
        try:
            for index in indexes:
                message_id = ids[index]
                if message_id in waiting:
                    # An earlier copy (of a batch that ended without its report) still waits in
                    # the producer: a stall, not the row's fault.
                    self._notice.refused(len(waiting), generation.last_report)
                    settle(index, _still_waiting(message_id))
                    return handed
                topic = topics[index]
                if topic not in known:
                    problem = await self._topics.lookup(topic, use_cache=True)
                    self._producer.require_same(generation)
                    if problem is not None:
                        settle(index, SendError(problem, retryable=False))
                        return handed
                key = keys[index]
                if key is None:
                    headers = [(MESSAGE_ID_HEADER, message_id)]
                else:
                    headers = [(MESSAGE_ID_HEADER, message_id), (ORDERING_KEY_HEADER, key)]
                extra = all_headers[index]
                if extra:
                    headers = [item for item in extra.items() if item[0] not in _RESERVED] + headers
                produce(
                    topic,
                    bodies[index],
                    key,
                    headers=headers,
                    on_delivery=functools.partial(
                        record, reports, placements, (settle, index, message_id)
                    ),
                )
                waiting.add(message_id)
                handed += 1
        except BufferError:
            rest = indexes[handed:]
            return handed + await self._after_full_queue(generation, rows, rest, settle, admitting)
        except KafkaException as exc:
            self._refused(generation, exc, rows, indexes[handed], settle)
        return handed

    def _ready(self) -> Generation:
        """The producer to hand rows to now: TransportError before start and after close,
        TransportUnavailableError while it is rebuilt."""
        generation = self._producer.generation
        if generation is None or self._producer.closed:
            generation = self._producer.current()
        if generation.fatal is not None:
            raise rebuilding(generation.fatal)
        if not len(generation.producer):
            # Nothing waited, so nothing is overdue: a stall is measured from now, not from the
            # last report (the poll thread may not have seen it empty yet).
            generation.last_report = time.monotonic()
        return generation

    async def _after_full_queue(
        self,
        generation: Generation,
        rows: Rows,
        indexes: Sequence[int],
        settle: Settle,
        admitting: Callable[[], bool],
    ) -> int:
        """librdkafka's local queue was full at ``indexes[0]``: wait for room, then go on
        (unless admission ended meanwhile, or the producer was replaced)."""
        if len(generation.producer) == 0:
            # Refused with an empty queue: the message alone is over the queue's size.
            index = indexes[0]
            settle(index, SendError(_over_queue(rows.message(index)), retryable=False))
            return 0
        await self._room.wait()
        self._producer.require_same(generation)
        if not admitting():
            return 0
        return await self.hand_over(rows, indexes, settle, admitting)

    def _refused(
        self,
        generation: Generation,
        exc: KafkaException,
        rows: Rows,
        index: int,
        settle: Settle,
    ) -> None:
        """``produce()`` refused the row at ``index``: a fatal error is the producer's (raised),
        anything else the row's (settled)."""
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError) and error.code() == KafkaError._FATAL:
            self._producer.mark_fatal(generation, error)
            raise rebuilding(generation.fatal or describe(error)) from exc
        settle(index, produce_error(exc, rows.message(index), self._max_bytes))


def _over_queue(message: OutgoingMessage) -> str:
    return (
        f"the message ({len(message.body):,} bytes of body) is larger than the producer's "
        "local queue (queue.buffering.max.kbytes), so librdkafka can never accept it; raise "
        "queue.buffering.max.kbytes above message.max.bytes"
    )


def _still_waiting(message_id: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"an earlier copy of message {message_id} still waits for Kafka's acknowledgement (the "
        "cluster is slow or stalled); this copy will be sent after it"
    )
