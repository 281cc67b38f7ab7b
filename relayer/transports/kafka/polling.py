"""The Kafka transport's librdkafka producer and the thread that polls it.

The producer is used as a whole :class:`~relayer.transports.kafka.stall.Generation`. One
background thread polls it: librdkafka runs the delivery callbacks there
(relayer.transports.kafka.deliveries collects them), and the thread hands each poll's reports
to the event loop in one ``call_soon_threadsafe``. The thread also watches for a stuck producer
(relayer.transports.kafka.stall). After a fatal error (from librdkafka, from ``poll()`` itself,
or a stuck producer) the thread purges the producer, whose messages then fail as "will be sent
again", and the event loop builds the next generation while the thread waits; a rebuild that
fails is tried again after a growing delay.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from relayer.errors import TransportError
from relayer.observability.throttle import ThrottledLog
from relayer.redact import redact
from relayer.transports.base import TransportUnavailableError
from relayer.transports.kafka.deliveries import Reports
from relayer.transports.kafka.log import LibrdkafkaLog, error_hint
from relayer.transports.kafka.rules import refused_settings
from relayer.transports.kafka.stall import Generation, drop_everything, stuck

# The package's name: every part of the transport logs as one (users filter on it).
logger = logging.getLogger("relayer.transports.kafka")

ProducerFactory = Callable[[dict[str, Any]], Any]

_POLL_SECONDS = 0.05
# The first wait before rebuilding a producer again after a rebuild failed (then doubling).
_REBUILD_RETRY_SECONDS = 1.0


class PolledProducer:
    """The current producer generation, its poll thread, and its rebuild after a fatal error.

    ``generation``, ``closed`` and ``reports`` are read by the produce loop (on the event
    loop's thread); ``reports`` is the one list every message's delivery callback appends to.
    """

    def __init__(
        self,
        *,
        name: str,
        path: str,
        store: str | None,
        config: dict[str, Any],
        new_producer: ProducerFactory,
        log: ThrottledLog,
        librdkafka: LibrdkafkaLog,
        timeouts: tuple[float, float],
        probe_topic: Callable[[], str | None],
        settle: Callable[[Generation, Reports], None],
        abandon: Callable[[TransportUnavailableError], None],
    ) -> None:
        """``timeouts``: the stall timeout and the metadata timeout (seconds);
        ``probe_topic``: a topic the stall probe may ask about; ``settle``: settles a hand-over
        of reports on the event loop; ``abandon``: fails what waits on a dead producer."""
        self._name = name
        self._path = path
        self._store = store
        self._config = config
        self._new_producer = new_producer
        self._log = log
        self._librdkafka = librdkafka
        self._stall_timeout, self._metadata_timeout = timeouts
        self._probe_topic = probe_topic
        self._settle = settle
        self._abandon = abandon
        self.generation: Generation | None = None
        self.closed = False
        self.reports: Reports = []
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._replaced = threading.Event()
        self._stopped: asyncio.Future[None] | None = None
        self._rebuild_failures = 0
        # How long the poll thread flushes when it stops (stop() sets it).
        self._flush_seconds = 0.0

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self, loop: asyncio.AbstractEventLoop) -> Generation:
        """Create the first producer and start polling it; returns it."""
        self._stopped = loop.create_future()
        self.generation = Generation(1, self._create(1))
        self._thread = threading.Thread(
            target=self._poll_forever,
            args=(loop,),
            name=f"relayer-kafka-{self._name}",
            daemon=True,
        )
        self._thread.start()
        return self.generation

    async def stop(self, flush_seconds: float) -> None:
        """Stop the poll thread once it flushed for at most ``flush_seconds``."""
        self.closed = True
        self._flush_seconds = flush_seconds
        if self._thread is not None and self._stopped is not None:
            self._stopping.set()
            self._replaced.set()
            await self._stopped
            await asyncio.to_thread(self._thread.join)
        self.generation = None

    def current(self) -> Generation:
        """The current generation; TransportError before start() and after stop()."""
        if self.generation is None or self.closed:
            raise TransportError(
                f"Kafka transport {self._name!r} is "
                f"{'closed' if self.closed else 'not started'}; call start() before publish()"
            )
        return self.generation

    def require_same(self, generation: Generation) -> None:
        """After an await in the produce loop: the producer it started with must still be the
        current one. A rebuild meanwhile failed the key's earlier messages (they die with the
        old producer), so this one must not go to the new producer ahead of their resend."""
        current = self.current()
        if current is not generation:
            raise rebuilding(generation.fatal or "the producer was replaced")

    def mark_fatal(self, generation: Generation, error: Any) -> None:
        if generation.fatal is None:
            generation.fatal = redact(describe(error))

    def _create(self, number: int) -> Any:
        config = dict(self._config)
        config["error_cb"] = functools.partial(self._on_error, number)
        config["logger"] = self._librdkafka
        try:
            return self._new_producer(config)
        except KafkaException as exc:
            raise refused_settings(self._name, self._config, describe(exc)) from exc

    # -- loop thread -----------------------------------------------------------------

    def _replace(self, generation: Generation) -> None:
        """After a fatal error: fail what the dead producer held, then start a new one."""
        self._abandon(rebuilding(generation.fatal or "unknown fatal error"))
        if not self.closed:
            number = generation.number + 1
            try:
                producer = self._create(number)
            except Exception as exc:  # e.g. an unreadable certificate after a rotation
                self._rebuild_later(generation, exc)
                return
            self._rebuild_failures = 0
            self.generation = Generation(number, producer)
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

    def _rebuild_later(self, generation: Generation, exc: Exception) -> None:
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

    # -- poll thread -----------------------------------------------------------------

    def _on_error(self, number: int, error: Any) -> None:
        generation = self.generation
        if generation is not None and generation.number == number and error.fatal():
            self.mark_fatal(generation, error)
            return
        text = redact(describe(error))
        code = error.code() if isinstance(error, KafkaError) else None
        self._log.warning(
            ("error", code),
            "%s: %s; %s",
            self._path,
            text,
            error_hint(code),
            extra={"action": "transport_error", "store": self._store, "error": text},
        )

    def _poll_forever(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while not self._stopping.is_set():
                generation = self.generation
                if generation is None:
                    break
                try:
                    generation.producer.poll(_POLL_SECONDS)
                except Exception as exc:
                    # A fatal error can also surface as an exception from poll() itself (and
                    # anything unexpected is treated alike): the thread must live on and
                    # rebuild the producer, or no ack ever resolves.
                    self.mark_fatal(generation, exc)
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
        if not self.reports:
            return
        # Copied and cleared, never replaced: each produce call bound this very list, and the
        # callbacks that fill it run in this thread, inside poll().
        reports = self.reports[:]
        self.reports.clear()
        loop.call_soon_threadsafe(self._settle, generation, reports)
        if polled:
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
            topic=self._probe_topic(),
        )
        if reason is not None:
            self.mark_fatal(generation, reason)

    def _retire(self, loop: asyncio.AbstractEventLoop, generation: Generation) -> None:
        drop_everything(generation.producer)
        self._hand_over(loop, generation, polled=False)
        self._replaced.clear()
        loop.call_soon_threadsafe(self._replace, generation)
        self._replaced.wait()

    def _final_flush(self, loop: asyncio.AbstractEventLoop) -> None:
        generation = self.generation
        if generation is None:
            return
        if generation.fatal is None and self._flush_seconds > 0:
            try:
                generation.producer.flush(self._flush_seconds)
            except Exception as exc:  # e.g. a fatal error raised by the flush: fail the rest
                logger.debug("Kafka transport %s: flush failed: %s", self._name, describe(exc))
        # Messages in flight are left to the producer's destruction: purging them would be a
        # gapless-guarantee violation that librdkafka reports as a fatal error, for nothing
        # (their rows stay in the outbox either way).
        drop_everything(generation.producer, in_flight=False)
        self._hand_over(loop, generation, polled=False)


def rebuilding(reason: str) -> TransportUnavailableError:
    return TransportUnavailableError(
        f"the Kafka producer stopped after a fatal error ({reason}); it is rebuilt and the "
        "message will be sent again"
    )


def describe(error: Any) -> str:
    """A librdkafka error (or any exception) in words: its name and text."""
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    if isinstance(error, KafkaError):
        return f"{error.name()}: {error.str()}"
    return str(error)


def _finish(stopped: asyncio.Future[None] | None) -> None:
    if stopped is not None and not stopped.done():
        stopped.set_result(None)
