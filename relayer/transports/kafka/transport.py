"""KafkaTransport: the transport the relay and unordered sending publish through (the
package's docstring says what it guarantees)."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer

from relayer.errors import TransportError
from relayer.observability.throttle import ThrottledLog
from relayer.redact import redact, redact_mapping
from relayer.transports.base import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    DestinationError,
    OutboundBatch,
    OutgoingMessage,
    SendError,
    Settle,
    TransportUnavailableError,
    fail_quietly,
)
from relayer.transports.kafka.log import LibrdkafkaLog, error_hint
from relayer.transports.kafka.placement import Placements
from relayer.transports.kafka.rules import (
    check_config,
    delivery_error,
    produce_error,
    refused_settings,
    topic_error,
)
from relayer.transports.kafka.stall import Generation, drop_everything, in_thread, stuck
from relayer.transports.options import Options
from relayer.transports.stalls import StallNotice

# The package's name: every part of the transport logs as one (users filter on it).
logger = logging.getLogger("relayer.transports.kafka")

_OWN_OPTIONS = ("close_timeout", "metadata_timeout")
_POLL_SECONDS = 0.05
# A missing topic is looked up again after this long, so a topic created meanwhile is found.
_MISSING_TOPIC_SECONDS = 5.0
# The first wait before rebuilding a producer again after a rebuild failed (then doubling).
_REBUILD_RETRY_SECONDS = 1.0

# ((future, message id), error, report) of publish()'s messages.
_Delivered = list[tuple[tuple[asyncio.Future[None], str], Any, Any]]
# Whom a publish_batch message's report settles: (settle, index, message id).
_Target = tuple[Settle, int, str]
_Settles = list[tuple[_Target, Any, Any]]
# Either kind of target; its last item is the message id.
_To = TypeVar("_To", tuple[asyncio.Future[None], str], _Target)
ProducerFactory = Callable[[dict[str, Any]], Any]


class KafkaTransport:
    """Publishes to Kafka topics; the destination is the topic name."""

    # OpenTelemetry's messaging.system for the relay's send spans (relayer.tracing).
    messaging_system = "kafka"

    def __init__(
        self,
        name: str,
        config: Mapping[str, Any],
        *,
        batch_deadline: timedelta | None = None,
        close_timeout: float = 30.0,
        metadata_timeout: float = 10.0,
        stall_timeout: float | None = None,
        producer_factory: ProducerFactory | None = None,
        store: str | None = None,
    ) -> None:
        """``store``: the store this transport serves, to name it in log lines."""
        self._name = name
        self._store = store
        self._path = f"stores.{store}.transports.{name}" if store else f"Kafka transport {name}"
        self._log = ThrottledLog(logger)
        self._librdkafka = LibrdkafkaLog(self._path, store)
        # No delivery report at all for this long while messages wait: either the cluster is
        # silent (a network or broker stall: wait for it) or, if it still answers a metadata
        # request, the producer is stuck (seen after a broker lost its producer ids: librdkafka
        # bumps the epoch forever) and is rebuilt.
        deadline = batch_deadline.total_seconds() if batch_deadline is not None else 0.0
        self._stall_timeout = stall_timeout if stall_timeout is not None else max(deadline, 10.0)
        self._config = check_config(config, batch_deadline)
        self._shown = redact_mapping(self._config)
        self._close_timeout = close_timeout
        self._metadata_timeout = metadata_timeout
        self._new_producer: ProducerFactory = producer_factory or Producer
        self._max_bytes = int(self._config.get("message.max.bytes", 1_000_000))
        self._generation: Generation | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._replaced = threading.Event()
        self._rebuild_failures = 0
        self._stopped: asyncio.Future[None] | None = None
        # How long the poll thread flushes when it stops (close() sets it).
        self._flush_seconds = close_timeout
        self._delivered: _Delivered = []
        self._outstanding: set[asyncio.Future[None]] = set()
        # Delivery reports of publish_batch's messages, collected by the poll thread.
        self._settles: _Settles = []
        self._space = asyncio.Event()
        self._waiting_for_space = 0
        self._known_topics: set[str] = set()
        self._missing_topics: dict[str, tuple[float, str]] = {}
        self._notice = StallNotice(
            logger, name, "Kafka", "check the brokers and the network between them and the worker"
        )
        self._closed = False

    @classmethod
    def from_options(
        cls,
        name: str,
        options: Mapping[str, Any],
        *,
        batch_deadline: timedelta | None = None,
        store: str | None = None,
    ) -> KafkaTransport:
        """The ``kafka`` factory: librdkafka settings plus relayer's two timeouts."""
        reader = Options(options)
        close_timeout = reader.seconds("close_timeout", 30.0)
        metadata_timeout = reader.seconds("metadata_timeout", 10.0)
        stall = reader.seconds("stall_timeout", 10.0) if "stall_timeout" in options else None
        config = dict(_flatten(reader.unread()))
        return cls(
            name,
            config,
            batch_deadline=batch_deadline,
            close_timeout=close_timeout,
            metadata_timeout=metadata_timeout,
            stall_timeout=stall,
            store=store,
        )

    def __repr__(self) -> str:
        return f"KafkaTransport(name={self._name!r}, config={self._shown!r})"

    @property
    def name(self) -> str:
        return self._name

    @property
    def pipelines_within_key(self) -> bool:
        return True

    async def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._stopped = self._loop.create_future()
        self._generation = Generation(1, self._create_producer(1))
        self._thread = threading.Thread(
            target=self._poll_forever, name=f"relayer-kafka-{self._name}", daemon=True
        )
        self._thread.start()
        try:
            await in_thread(self._generation.producer.list_topics, None, self._metadata_timeout)
        except KafkaException as exc:
            await self.close()
            raise TransportError(
                f"{self._path} cannot reach the cluster at "
                f"{self._shown.get('bootstrap.servers')!r} within {self._metadata_timeout:g} s: "
                f"{_text(exc)}; check bootstrap.servers, the network and the security settings"
            ) from exc
        logger.info(
            "%s connected to %s",
            self._path,
            self._shown.get("bootstrap.servers"),
            extra={"action": "transport_start", "store": self._store},
        )

    async def ordered_by_key(self, destination: str) -> bool:
        """True once metadata shows the topic exists: Kafka keeps order per key natively."""
        problem = await self._lookup_topic(destination)  # unreachable: TransportUnavailableError
        if problem is not None:
            raise DestinationError(problem)
        return True

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        generation = self._generation
        if generation is None or self._closed:
            generation = self._require_started()
        future: asyncio.Future[None] = asyncio.Future(loop=self._loop)
        topic = message.destination
        if topic not in self._known_topics:
            problem = await self._lookup_topic(topic, use_cache=True)
            if problem is not None:
                fail_quietly(future, SendError(problem, retryable=False))
                return future
            self._require_same(generation)
        key = message.key
        message_id = str(message.id)
        if message_id in generation.waiting:
            # As in publish_batch: an earlier copy still waits in the producer (a stall), so no
            # second copy is queued behind it.
            self._notice.refused(len(generation.waiting), generation.last_report)
            fail_quietly(future, _still_waiting(message_id))
            return future
        if key is None:
            headers = [(MESSAGE_ID_HEADER, message_id)]
        else:
            headers = [(MESSAGE_ID_HEADER, message_id), (ORDERING_KEY_HEADER, key)]
        if message.headers:
            headers = [
                item for item in message.headers.items() if item[0] not in _RESERVED
            ] + headers
        callback = functools.partial(
            _record_report, self._delivered, generation.placements, (future, message_id)
        )
        while True:
            if generation.fatal is not None:
                raise _rebuilding(generation.fatal)
            if not len(generation.producer):
                # Nothing waited, so nothing is overdue: a stall is measured from now, not
                # from the last report (the poll thread may not have seen it empty yet).
                generation.last_report = time.monotonic()
            try:
                generation.producer.produce(
                    topic,
                    message.body,
                    None if key is None else key.encode(),
                    headers=headers,
                    on_delivery=callback,
                )
            except BufferError:
                if len(generation.producer) == 0:
                    # Refused with an empty queue: the message alone is over the queue's size.
                    fail_quietly(future, SendError(_over_queue(message), retryable=False))
                    return future
                await self._wait_for_space()
                self._require_same(generation)
                continue
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() == KafkaError._FATAL:
                    self._mark_fatal(generation, error)
                    continue
                fail_quietly(future, produce_error(exc, message, self._max_bytes))
                return future
            generation.waiting.add(message_id)
            self._outstanding.add(future)
            return future

    async def publish_batch(
        self,
        batch: OutboundBatch,
        indexes: Sequence[int],
        settle: Settle,
        admitting: Callable[[], bool],
    ) -> int:
        """``publish`` for many rows (the relay's way): one produce call a row, no future; the
        delivery reports of one poll settle on the event loop in one callback."""
        generation = self._generation
        if generation is None or self._closed:
            generation = self._require_started()
        ids, keys, topics = batch.ids, batch.keys, batch.destinations
        bodies, all_headers = batch.bodies, batch.headers
        known = self._known_topics
        settles = self._settles
        placements = generation.placements
        record = _record_report
        handed = 0
        if generation.fatal is not None:
            raise _rebuilding(generation.fatal)
        produce = generation.producer.produce
        waiting = generation.waiting
        if not len(generation.producer):
            generation.last_report = time.monotonic()  # as in publish: nothing was overdue
        try:
            for index in indexes:
                message_id = ids[index]
                if message_id in waiting:
                    # An earlier copy (of a batch that ended without its report) still waits in
                    # the producer: a stall, not the row's fault. No second copy is queued behind
                    # it, so a long stall does not pile up copies to deliver afterwards.
                    self._notice.refused(len(waiting), generation.last_report)
                    settle(index, _still_waiting(message_id))
                    return handed
                topic = topics[index]
                if topic not in known:
                    problem = await self._lookup_topic(topic, use_cache=True)
                    self._require_same(generation)
                    if problem is not None:
                        settle(index, SendError(problem, retryable=False))
                        return handed
                key = keys[index]
                headers = [(MESSAGE_ID_HEADER, ids[index]), (ORDERING_KEY_HEADER, key)]
                extra = all_headers[index]
                if extra:
                    headers = [item for item in extra.items() if item[0] not in _RESERVED] + headers
                produce(
                    topic,
                    bodies[index],
                    key,
                    headers=headers,
                    on_delivery=functools.partial(
                        record, settles, placements, (settle, index, message_id)
                    ),
                )
                waiting.add(message_id)
                handed += 1
        except BufferError:
            return await self._after_full_queue(
                generation,
                batch=batch,
                indexes=indexes,
                settle=settle,
                admitting=admitting,
                handed=handed,
            )
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError._FATAL:
                self._mark_fatal(generation, error)
                raise _rebuilding(generation.fatal or _text(error)) from exc
            index = indexes[handed]
            settle(index, produce_error(exc, batch.message(index), self._max_bytes))
            return handed
        return handed

    async def _after_full_queue(
        self,
        generation: Generation,
        *,
        batch: OutboundBatch,
        indexes: Sequence[int],
        settle: Settle,
        admitting: Callable[[], bool],
        handed: int,
    ) -> int:
        """librdkafka's local queue was full at ``indexes[handed]``: wait for room, then go on
        (unless admission ended meanwhile, or the producer was replaced)."""
        if len(generation.producer) == 0:
            # Refused with an empty queue: the message alone is over the queue's size.
            index = indexes[handed]
            settle(index, SendError(_over_queue(batch.message(index)), retryable=False))
            return handed
        await self._wait_for_space()
        self._require_same(generation)
        if not admitting():
            return handed
        rest = await self.publish_batch(batch, indexes[handed:], settle, admitting)
        return handed + rest

    async def close(self) -> None:
        """Flush (up to ``close_timeout``), fail what is left as retryable, stop the thread."""
        await self.close_within(self._close_timeout)

    async def close_within(self, seconds: float) -> None:
        """``close``, flushing for at most ``seconds`` (and at most ``close_timeout``): a
        stopping worker passes what is left of its stop budget. Nothing waits on the cluster
        beyond that, so a stalled broker cannot hold up a worker's exit."""
        if self._closed:
            return
        self._closed = True
        self._flush_seconds = max(min(self._close_timeout, seconds), 0.0)
        if self._thread is not None and self._stopped is not None:
            self._stopping.set()
            self._replaced.set()
            await self._stopped
            await asyncio.to_thread(self._thread.join)
        leftover = TransportUnavailableError(
            f"Kafka transport {self._name!r} closed before the broker acknowledged the "
            "message; it will be sent again"
        )
        for future in self._outstanding:
            if not future.done():
                fail_quietly(future, leftover)
        self._outstanding.clear()
        self._generation = None
        self._log.flush()
        self._librdkafka.flush()

    # -- loop thread -----------------------------------------------------------------

    def _require_same(self, generation: Generation) -> None:
        """After an await inside ``publish``: the producer it started with must still be the
        current one. A rebuild meanwhile failed the key's earlier messages (they die with the
        old producer), so this one must not go to the new producer ahead of their resend."""
        current = self._require_started()
        if current is not generation:
            raise _rebuilding(generation.fatal or "the producer was replaced")

    def _require_started(self) -> Generation:
        if self._generation is None or self._closed:
            raise TransportError(
                f"Kafka transport {self._name!r} is "
                f"{'closed' if self._closed else 'not started'}; call start() before publish()"
            )
        return self._generation

    async def _wait_for_space(self) -> None:
        # librdkafka's local queue is full: wait for deliveries to free space (backpressure).
        self._space.clear()
        self._waiting_for_space += 1
        try:
            async with asyncio.timeout(_POLL_SECONDS * 2):
                await self._space.wait()
        except TimeoutError:
            pass
        finally:
            self._waiting_for_space -= 1

    def _resolve(self, generation: Generation, delivered: _Delivered) -> None:
        if self._notice.since is not None and any(error is None for _, error, _ in delivered):
            self._notice.acknowledged()
        outstanding = self._outstanding
        waiting = generation.waiting
        unplaced: list[Any] = []
        for (future, message_id), error, report in delivered:
            outstanding.discard(future)
            waiting.discard(message_id)
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            elif error is UNPLACED:
                unplaced.append(report)
                fail_quietly(future, _unplaced(report))
            elif error.code() in _NOT_SENT:
                fail_quietly(
                    future,
                    TransportUnavailableError(
                        f"the Kafka producer dropped the message unacknowledged ({error.str()}): "
                        "it was closed or hit a fatal error; the message will be sent again"
                    ),
                )
            else:
                fail_quietly(future, delivery_error(error, report, self._max_bytes))
        if unplaced:
            self._warn_unplaced(unplaced)
        if self._waiting_for_space:
            self._space.set()

    def _resolve_settles(self, generation: Generation, settles: _Settles) -> None:
        waiting = generation.waiting
        dropped: TransportUnavailableError | None = None
        unplaced: list[Any] = []
        if self._notice.since is not None and any(error is None for _, error, _ in settles):
            self._notice.acknowledged()
        for (settle, index, message_id), error, report in settles:
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
        if self._waiting_for_space:
            self._space.set()

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

    def _replace(self, generation: Generation) -> None:
        """After a fatal error: fail what the dead producer held, then start a new one."""
        failure = _rebuilding(generation.fatal or "unknown fatal error")
        for future in self._outstanding:
            if not future.done():
                fail_quietly(future, failure)
        self._outstanding.clear()
        if not self._closed:
            number = generation.number + 1
            try:
                producer = self._create_producer(number)
            except Exception as exc:  # e.g. an unreadable certificate after a rotation
                delay = min(_REBUILD_RETRY_SECONDS * 2**self._rebuild_failures, 30.0)
                self._rebuild_failures += 1
                self._log.error(
                    "rebuild_failed",
                    "%s could not rebuild its producer (%s); retrying in %g s; fix the "
                    "transport's settings or files (certificates) it names",
                    self._path,
                    redact(str(exc)),
                    delay,
                    extra={
                        "action": "transport_rebuild_failed",
                        "store": self._store,
                        "error": redact(str(exc)),
                    },
                )
                # The dead producer stays current, so publishes fail as unavailable meanwhile.
                asyncio.get_running_loop().call_later(delay, self._replace, generation)
                return
            self._rebuild_failures = 0
            self._generation = Generation(number, producer)
            self._log.warning(
                "rebuild",
                "%s rebuilt its producer after a fatal error: %s; the messages it held "
                "are sent again (if this repeats, check the brokers' logs)",
                self._path,
                generation.fatal,
                extra={
                    "action": "transport_rebuild",
                    "store": self._store,
                    "error": generation.fatal,
                },
            )
        self._replaced.set()

    def _mark_fatal(self, generation: Generation, error: Any) -> None:
        if generation.fatal is None:
            generation.fatal = redact(_text(error))

    async def _lookup_topic(self, topic: str, *, use_cache: bool = False) -> str | None:
        """None if ``topic`` exists, else what is wrong and how to fix it.

        Raises TransportUnavailableError when the cluster does not answer in time.
        """
        if use_cache and topic in self._missing_topics:
            since, remembered = self._missing_topics[topic]
            if time.monotonic() - since < _MISSING_TOPIC_SECONDS:
                return remembered
        generation = self._require_started()
        try:
            metadata = await in_thread(
                generation.producer.list_topics, topic, self._metadata_timeout
            )
        except KafkaException as exc:
            raise TransportUnavailableError(
                f"could not look up Kafka topic {topic!r} within {self._metadata_timeout:g} s: "
                f"{_text(exc)}; check that the cluster is reachable"
            ) from exc
        problem = topic_error(topic, metadata)
        if problem is None:
            self._known_topics.add(topic)
            self._missing_topics.pop(topic, None)
        else:
            self._missing_topics[topic] = (time.monotonic(), problem)
        return problem

    def _create_producer(self, number: int) -> Any:
        config = dict(self._config)
        config["error_cb"] = functools.partial(self._on_error, number)
        config["logger"] = self._librdkafka
        try:
            return self._new_producer(config)
        except KafkaException as exc:
            raise refused_settings(self._name, self._config, _text(exc)) from exc

    # -- poll thread -----------------------------------------------------------------

    def _on_error(self, number: int, error: Any) -> None:
        generation = self._generation
        if generation is not None and generation.number == number and error.fatal():
            self._mark_fatal(generation, error)
            return
        text = redact(_text(error))
        code = error.code() if isinstance(error, KafkaError) else None
        self._log.warning(
            ("error", code),
            "%s: %s; %s",
            self._path,
            text,
            error_hint(code),
            extra={"action": "transport_error", "store": self._store, "error": text},
        )

    def _poll_forever(self) -> None:
        loop = self._loop
        assert loop is not None
        try:
            while not self._stopping.is_set():
                generation = self._generation
                if generation is None:
                    break
                try:
                    generation.producer.poll(_POLL_SECONDS)
                except Exception as exc:
                    # A fatal error can also surface as an exception from poll() itself (and
                    # anything unexpected is treated alike): the thread must live on and
                    # rebuild the producer, or no ack ever resolves.
                    self._mark_fatal(generation, exc)
                self._hand_over(loop, generation)
                self._log.flush_due()
                self._librdkafka.flush_due()
                self._watch_for_stall(generation)
                if generation.fatal is not None:
                    self._retire(loop, generation)
            self._final_flush(loop)
        finally:
            loop.call_soon_threadsafe(_finish, self._stopped)

    def _hand_over(
        self, loop: asyncio.AbstractEventLoop, generation: Generation, *, polled: bool = True
    ) -> None:
        """Hand the collected reports to the event loop; ``polled``: they came from polling
        (not from a purge of ours), so the cluster answered."""
        reported = False
        if self._delivered:
            batch = self._delivered[:]
            self._delivered.clear()
            reported = True
            loop.call_soon_threadsafe(self._resolve, generation, batch)
        if self._settles:
            # Copied and cleared, never replaced: each produce call bound this very list, and
            # the callbacks that fill it run in this thread, inside poll().
            settles = self._settles[:]
            self._settles.clear()
            reported = True
            loop.call_soon_threadsafe(self._resolve_settles, generation, settles)
        if reported and polled:
            generation.last_report = time.monotonic()
            generation.probe = None

    def _watch_for_stall(self, generation: Generation) -> None:
        """Rebuild ``generation`` if it is stuck (see relayer.transports.kafka.stall); a
        silent cluster is waited for, its messages kept."""
        if generation.fatal is not None:
            return
        reason = stuck(
            generation,
            stall_timeout=self._stall_timeout,
            probe_timeout=self._metadata_timeout,
            topic=next(iter(self._known_topics), None),
        )
        if reason is not None:
            self._mark_fatal(generation, reason)

    def _retire(self, loop: asyncio.AbstractEventLoop, generation: Generation) -> None:
        drop_everything(generation.producer)
        self._hand_over(loop, generation, polled=False)
        self._replaced.clear()
        loop.call_soon_threadsafe(self._replace, generation)
        self._replaced.wait()

    def _final_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        generation = self._generation
        if generation is None:
            return
        if generation.fatal is None and self._flush_seconds > 0:
            try:
                generation.producer.flush(self._flush_seconds)
            except Exception as exc:  # e.g. a fatal error raised by the flush: fail the rest
                logger.debug("Kafka transport %s: flush failed: %s", self._name, _text(exc))
        # Messages in flight are left to the producer's destruction: purging them would be a
        # gapless-guarantee violation that librdkafka reports as a fatal error, for nothing
        # (their rows stay in the outbox either way).
        drop_everything(generation.producer, in_flight=False)
        self._hand_over(loop, generation, polled=False)


_RESERVED = frozenset({MESSAGE_ID_HEADER, ORDERING_KEY_HEADER})
# Delivery reports of messages dropped by a purge or a fatal error: nothing wrong with them.
_NOT_SENT = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT, KafkaError._FATAL})


# A successful report that does not place its message (relayer.transports.kafka.placement):
# what the poll thread records instead of no error, for the loop to resend the row.
UNPLACED: Any = object()


def _record_report(
    reports: list[tuple[_To, Any, Any]],
    placements: Placements,
    target: _To,
    error: Any,
    report: Any,
) -> None:
    # Runs in the poll thread, inside producer.poll(): only collect; the loop resolves (a
    # publish() future) or settles (a publish_batch message).
    if error is not None:
        reports.append((target, error, report))
    elif placements.placed(report):
        reports.append((target, None, None))
    else:
        reports.append((target, UNPLACED, report))


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


def _finish(stopped: asyncio.Future[None] | None) -> None:
    if stopped is not None and not stopped.done():
        stopped.set_result(None)


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


def _rebuilding(reason: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"the Kafka producer stopped after a fatal error ({reason}); it is rebuilt and the "
        "message will be sent again"
    )


def _flatten(options: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """librdkafka names from options: ``bootstrap_servers`` and TOML's unquoted dotted keys
    (``bootstrap.servers = ...`` is a nested table there) both become ``bootstrap.servers``."""
    for key, value in options.items():
        name = prefix + key.replace("_", ".")
        if isinstance(value, Mapping):
            yield from _flatten(value, name + ".")
        else:
            yield name, value


def _text(error: Any) -> str:
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    if isinstance(error, KafkaError):
        return f"{error.name()}: {error.str()}"
    return str(error)
