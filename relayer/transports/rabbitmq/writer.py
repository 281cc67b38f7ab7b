"""The RabbitMQ transport's publishes on its channel: encoded, written, confirmed.

Publishes are written in the order they are queued. Those of one event-loop turn go out
together, in writes of about 1 MiB (the fast path of relayer.transports.rabbitmq.frames), or
each through aiormq's ``basic_publish`` (the public path). Two limits make a publish wait
(backpressure): the last write still in the socket buffer, and ``max_outstanding`` publishes
not yet confirmed. Each publish is settled once: from the broker's confirm, or at once when it
is not written (its channel is gone, or an earlier copy of it is still unconfirmed).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiormq
from aiormq import spec
from aiormq.abc import ChannelFrame

from relayer.transports.base import MESSAGE_ID_HEADER, ORDERING_KEY_HEADER, SendError
from relayer.transports.rabbitmq import frames
from relayer.transports.rabbitmq.link import Link
from relayer.transports.rabbitmq.outcomes import (
    MAX_HEADER_NAME_BYTES,
    long_header_name,
    lost,
    not_encodable,
    refused,
    still_unconfirmed,
)
from relayer.transports.rabbitmq.routes import Route
from relayer.transports.stalls import StallNotice

# Told a publish's outcome: None when the broker confirmed it, else why not.
Outcome = Callable[[BaseException | None], None]

# Publishes of one event-loop turn are joined into writes of about this many bytes.
_WRITE_BYTES = 1 << 20


@dataclass(slots=True)
class Queued:
    """An encoded publish waiting for this event-loop turn's write (``payload``; on the public
    path the body and properties instead), and who to tell its outcome."""

    underlay: Any
    payload: bytes
    message_id: str
    route: Route
    routing_key: str
    settle: Outcome
    body: bytes
    properties: spec.Basic.Properties | None


def _public_properties(
    underlay: Any, route: Route, routing_key: str, message_id: str, headers: Mapping[str, str]
) -> spec.Basic.Properties:
    """The public path's properties for basic_publish, which encodes the publish itself;
    refuses here (ValueError) what it could not encode."""
    properties = frames.reference_properties(message_id, headers)
    frames.reference_encoding(
        underlay.number,
        underlay.max_content_size,
        exchange=route.exchange,
        routing_key=routing_key,
        body=b"",
        properties=properties,
    )
    return properties


class ChannelWriter:
    """Writes the queued publishes on the link's channel and counts those not yet confirmed.

    ``frames`` are written frames not yet handed to aiormq's connection writer, ``pump`` the
    task that hands them over while its queue is full.
    """

    def __init__(self, link: Link, *, max_outstanding: int, notice: StallNotice) -> None:
        self._link = link
        self._notice = notice
        # Unconfirmed publishes, and their most before a publish waits (room is signalled by
        # _room once a confirm frees one).
        self._unconfirmed = 0
        self._max_outstanding = max_outstanding
        self._room = asyncio.Event()
        # When the broker last confirmed a message (or a publish found none waiting); a stall
        # is said once, and when it is over.
        self._confirmed_at = time.monotonic()
        self._queued: list[Queued] = []
        self._queued_bytes = 0
        self._flush_scheduled = False
        self._drained: asyncio.Future[None] | None = None
        self._fallback_tasks: set[asyncio.Task[None]] = set()
        self.frames: collections.deque[ChannelFrame] = collections.deque()
        self.pump: asyncio.Task[None] | None = None

    def must_wait(self) -> bool:
        """Whether the next publish would wait for room."""
        drained = self._drained
        return self._unconfirmed >= self._max_outstanding or (
            drained is not None and not drained.done()
        )

    async def publish(
        self,
        underlay: Any,
        route: Route,
        routing_key: str,
        *,
        key: str | None,
        message_id: str,
        body: bytes,
        extra_headers: Mapping[str, str] | None,
        settle: Outcome,
    ) -> SendError | None:
        """Queue one publish for this turn's write on ``underlay`` once there is room (the
        application's headers ``extra_headers`` and relayer's); the SendError if AMQP cannot
        carry it."""
        drained = self._drained
        if drained is not None and not drained.done():
            # Backpressure: the previous write is still in the socket's buffer (a slow or
            # blocked broker); queue nothing more until it has gone out. Other publishes wait
            # on the same future: asyncio.wait neither cancels it when this caller is
            # cancelled (a batch deadline) nor raises its error (a lost connection, which the
            # flush sees).
            await asyncio.wait((drained,))
        while self._unconfirmed >= self._max_outstanding:
            self._room.clear()
            await self._room.wait()
        headers: dict[str, str] = dict(extra_headers) if extra_headers else {}
        for name in headers:
            if len(name.encode()) > MAX_HEADER_NAME_BYTES:
                return long_header_name(name)
        headers[MESSAGE_ID_HEADER] = message_id
        if key is not None:
            headers[ORDERING_KEY_HEADER] = key
        encoder = self._link.encoder if underlay is self._link.underlay else None
        properties: spec.Basic.Properties | None = None
        try:
            if encoder is not None:
                payload = encoder.publish(route.exchange, routing_key, body, message_id, headers)
            else:
                payload = b""
                properties = _public_properties(underlay, route, routing_key, message_id, headers)
        except Exception as exc:  # a value AMQP cannot carry
            return not_encodable(exc)
        if not self._unconfirmed:  # nothing waited for a confirm: nothing is overdue
            self._confirmed_at = time.monotonic()
        self._unconfirmed += 1
        self._queued.append(
            Queued(underlay, payload, message_id, route, routing_key, settle, body, properties)
        )
        self._queued_bytes += len(payload)
        if self._queued_bytes >= _WRITE_BYTES:
            self.flush()  # now: the next publish waits for this write to drain
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)
        return None

    def flush(self) -> None:
        """Write every publish queued in this event-loop turn, in order, in writes of about
        1 MiB (the fast path), or hand each to aiormq's basic_publish (the public path).

        Only this transport writes on its publishing channel, so numbering the messages here
        (with no await in between) numbers them exactly as the broker will; the confirm
        tracking settles them from the broker's acks, nacks and returns, and fails them all if
        the channel or connection is lost.
        """
        self._flush_scheduled = False
        queued, self._queued = self._queued, []
        self._queued_bytes = 0
        writes: list[bytes] = []
        payloads: list[bytes] = []
        size = 0
        underlay = self._link.underlay
        # The broker may have closed the channel already: aiormq forgets its number at once,
        # is_closed follows a few turns later. Publishes written then would be a protocol error.
        usable = (
            underlay is not None
            and not underlay.is_closed
            and underlay.connection.channels.get(underlay.number) is underlay
        )
        confirms = self._link.confirms
        for item in queued:
            if not usable or item.underlay is not underlay:
                self._settle_unwritten(item, lost(item.route, ConnectionError("channel closed")))
                continue
            if item.message_id in getattr(underlay, "message_id_delivery_tag", ()):
                # A basic.return names the message by its id: with two copies unconfirmed, a
                # return could fail the wrong one. The earlier copy settles first; this one is
                # the broker's delay, not the row's fault (no attempt is counted).
                self._notice.refused(self._unconfirmed, self._confirmed_at)
                self._settle_unwritten(item, still_unconfirmed(item.message_id))
                continue
            if confirms is None or item.properties is not None:
                self._publish_public(underlay, item)
                continue
            confirms.track(item.message_id, functools.partial(self._settle, item))
            payloads.append(item.payload)
            size += len(item.payload)
            if size >= _WRITE_BYTES:  # large messages: several writes, not one huge copy
                writes.append(b"".join(payloads))
                payloads, size = [], 0
        if payloads:
            writes.append(b"".join(payloads))
        if writes:
            self._write(underlay, writes)

    def _write(self, underlay: Any, writes: list[bytes]) -> None:
        # The writer resolves this once the turn's last write has left the socket buffer; aiormq
        # fails it when the connection is lost, and publishes only wait for it (asyncio.wait
        # does not retrieve an exception): retrieve it, or asyncio reports each lost write.
        self._drained = underlay.create_future()
        self._drained.add_done_callback(_retrieve)
        self.frames.extend(frames.write(writes, self._drained))
        self.write_frames(underlay)

    def _publish_public(self, underlay: Any, item: Queued) -> None:
        """The public path: aiormq's basic_publish, one task per message, written in order
        (the channel's lock is fair) and settled by its confirmation."""

        async def publish() -> None:
            try:
                await underlay.basic_publish(
                    item.body,
                    exchange=item.route.exchange,
                    routing_key=item.routing_key,
                    properties=item.properties,
                    mandatory=True,
                )
            except BaseException as exc:
                self._settle(item, exc if isinstance(exc, Exception) else ConnectionError(exc))
                if not isinstance(exc, Exception):
                    raise
            else:
                self._settle(item, None)

        task = asyncio.get_running_loop().create_task(publish())
        self._fallback_tasks.add(task)
        task.add_done_callback(self._fallback_tasks.discard)

    def write_frames(self, underlay: Any) -> None:
        """Hand written frames to aiormq's connection writer, in order; when its small queue
        is full, one task waits for room (later frames queue behind it)."""
        if self.pump is not None:
            return
        queue: asyncio.Queue[ChannelFrame] = underlay.write_queue
        while self.frames and not queue.full():
            queue.put_nowait(self.frames.popleft())
        if self.frames:
            self.pump = asyncio.get_running_loop().create_task(self._pump_frames(queue))

    async def _pump_frames(self, queue: asyncio.Queue[ChannelFrame]) -> None:
        try:
            while self.frames:
                await queue.put(self.frames[0])
                self.frames.popleft()
        finally:
            if self.pump is asyncio.current_task():
                self.pump = None

    def drop_unwritten(self) -> None:
        """The connection is let go: frames not yet handed to it die with it (their
        confirmations fail when it closes); frames for the next one must not queue behind."""
        self.frames.clear()
        if self.pump is not None:
            self.pump.cancel()
            self.pump = None

    def _settle(self, item: Queued, error: BaseException | None) -> None:
        """The broker's answer for one message, as the relay understands it."""
        self._release_room()
        if error is None:
            item.settle(None)
            self._confirmed_at = time.monotonic()
            if self._notice.since is not None:
                self._notice.acknowledged()
            return
        if isinstance(error, aiormq.exceptions.ChannelNotFoundEntity):
            # The broker closed the channel (an exchange was deleted): every outstanding
            # confirm on it fails. The next publish re-checks the exchange on a new channel.
            self._link.exchanges.clear()
        item.settle(refused(error, item.route, item.routing_key))

    def _settle_unwritten(self, item: Queued, error: Exception) -> None:
        """A queued publish that is not written: its room back, ``error`` to the relay."""
        self._release_room()
        item.settle(error)

    def _release_room(self) -> None:
        self._unconfirmed -= 1
        if self._unconfirmed < self._max_outstanding:
            self._room.set()


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
