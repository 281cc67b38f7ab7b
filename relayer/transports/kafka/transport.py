"""KafkaTransport: its options, start, the two ways to publish (both through the one produce
loop of relayer.transports.kafka.produce) and close. The package's docstring says what the
transport guarantees."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

from confluent_kafka import KafkaException, Producer

from relayer.errors import TransportError
from relayer.observability.throttle import ThrottledLog
from relayer.redact import redact_mapping
from relayer.transports.base import (
    DestinationError,
    OutboundBatch,
    OutgoingMessage,
    Settle,
    TransportUnavailableError,
    fail_quietly,
)
from relayer.transports.kafka.deliveries import Deliveries
from relayer.transports.kafka.log import LibrdkafkaLog
from relayer.transports.kafka.polling import PolledProducer, ProducerFactory, describe
from relayer.transports.kafka.produce import OneMessage, ProduceLoop, QueueRoom, Topics
from relayer.transports.kafka.rules import check_config
from relayer.transports.kafka.stall import in_thread
from relayer.transports.options import Options
from relayer.transports.stalls import StallNotice

# The package's name: every part of the transport logs as one (users filter on it).
logger = logging.getLogger("relayer.transports.kafka")

# publish()'s message is row 0 of its one-row batch.
_ONLY_ROW = (0,)


class KafkaTransport:
    """Publishes to Kafka topics; the destination is the topic name."""

    # OpenTelemetry's messaging.system for the relay's send spans (relayer.relay.trace).
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
        if stall_timeout is None:
            stall_timeout = _default_stall_timeout(batch_deadline)
        config = check_config(config, batch_deadline)
        self._shown = redact_mapping(config)
        self._close_timeout = close_timeout
        self._metadata_timeout = metadata_timeout
        max_bytes = int(config.get("message.max.bytes", 1_000_000))
        # publish()'s futures not resolved yet: failed when their producer dies or at close.
        self._outstanding: set[asyncio.Future[None]] = set()
        notice = StallNotice(
            logger, name, "Kafka", "check the brokers and the network between them and the worker"
        )
        room = QueueRoom()
        deliveries = Deliveries(
            path=self._path,
            store=store,
            log=self._log,
            notice=notice,
            max_bytes=max_bytes,
            freed=room.freed,
        )
        self._producer = PolledProducer(
            name=name,
            path=self._path,
            store=store,
            config=config,
            new_producer=producer_factory or Producer,
            log=self._log,
            librdkafka=self._librdkafka,
            timeouts=(stall_timeout, metadata_timeout),
            probe_topic=self._any_known_topic,
            settle=deliveries.settle,
            abandon=self._fail_outstanding,
        )
        self._topics = Topics(self._producer, metadata_timeout)
        self._produce = ProduceLoop(
            self._producer, self._topics, notice=notice, room=room, max_bytes=max_bytes
        )

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
        if self._producer.started:
            return
        generation = self._producer.start(asyncio.get_running_loop())
        try:
            await in_thread(generation.producer.list_topics, None, self._metadata_timeout)
        except KafkaException as exc:
            await self.close()
            raise TransportError(
                f"{self._path} cannot reach the cluster at "
                f"{self._shown.get('bootstrap.servers')!r} within {self._metadata_timeout:g} s: "
                f"{describe(exc)}; check bootstrap.servers, the network and the security "
                "settings"
            ) from exc
        logger.info(
            "%s connected to %s",
            self._path,
            self._shown.get("bootstrap.servers"),
            extra={"action": "transport_start", "store": self._store},
        )

    async def ordered_by_key(self, destination: str) -> bool:
        """True once metadata shows the topic exists: Kafka keeps order per key natively."""
        problem = await self._topics.lookup(destination)  # unreachable: TransportUnavailableError
        if problem is not None:
            raise DestinationError(problem)
        return True

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        # A batch of one row through the one produce loop; its settle callback resolves the
        # future.
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        settle = functools.partial(_settle_future, self._outstanding, future)
        if await self._produce.hand_over(OneMessage(message), _ONLY_ROW, settle, _always):
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
        return await self._produce.hand_over(batch, indexes, settle, admitting)

    async def close(self) -> None:
        """Flush (up to ``close_timeout``), fail what is left as retryable, stop the thread."""
        await self.close_within(self._close_timeout)

    async def close_within(self, seconds: float) -> None:
        """``close``, flushing for at most ``seconds`` (and at most ``close_timeout``): a
        stopping worker passes what is left of its stop budget. Nothing waits on the cluster
        beyond that, so a stalled broker cannot hold up a worker's exit."""
        if self._producer.closed:
            return
        await self._producer.stop(max(min(self._close_timeout, seconds), 0.0))
        self._fail_outstanding(
            TransportUnavailableError(
                f"Kafka transport {self._name!r} closed before the broker acknowledged the "
                "message; it will be sent again"
            )
        )
        self._log.flush()
        self._librdkafka.flush()

    def _fail_outstanding(self, error: TransportUnavailableError) -> None:
        for future in self._outstanding:
            if not future.done():
                fail_quietly(future, error)
        self._outstanding.clear()

    def _any_known_topic(self) -> str | None:
        """A topic for the stall probe's metadata request (called in the poll thread)."""
        return next(iter(self._topics.known), None)


def _default_stall_timeout(batch_deadline: timedelta | None) -> float:
    """How long no delivery report at all may come while messages wait: then either the
    cluster is silent (a network or broker stall: wait for it) or, if it still answers a
    metadata request, the producer is stuck (seen after a broker lost its producer ids:
    librdkafka bumps the epoch forever) and is rebuilt."""
    deadline = batch_deadline.total_seconds() if batch_deadline is not None else 0.0
    return max(deadline, 10.0)


def _settle_future(
    outstanding: set[asyncio.Future[None]],
    future: asyncio.Future[None],
    index: int,
    error: BaseException | None,
) -> None:
    """publish()'s settle callback: the message's outcome to its future."""
    outstanding.discard(future)
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        fail_quietly(future, error)


def _always() -> bool:
    """publish()'s admission: a single message is admitted however long it waited for room."""
    return True


def _flatten(options: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """librdkafka names from options: ``bootstrap_servers`` and TOML's unquoted dotted keys
    (``bootstrap.servers = ...`` is a nested table there) both become ``bootstrap.servers``."""
    for key, value in options.items():
        name = prefix + key.replace("_", ".")
        if isinstance(value, Mapping):
            yield from _flatten(value, name + ".")
        else:
            yield name, value
