"""RabbitMQ publishes written as raw AMQP frames on an aiormq channel: the fast path.

aiormq's public ``basic_publish`` costs a coroutine, a channel lock, a queue hand-off, a
socket write and several futures per message; on two cores that, not the broker, limited the
relay. This module instead encodes each publish itself (method, content header and body
frames), hands the frames of many publishes to the connection's writer at once, and tracks the
publisher confirms of its channel itself: one small object per message, settled straight from
the broker's ack (a ``multiple`` ack settles a run of messages in one pass).

It relies on internals of aiormq's ``Channel`` (the delivery tag counter, the ``confirmations``
and ``message_id_delivery_tag`` maps that its return handling uses, the write queue, the
confirm-frame handler) that were read and tested for the versions in ``TESTED_AIORMQ``. With
any other aiormq, or a channel without those members, ``fast_path_problem`` says why, and the
transport publishes through ``basic_publish`` instead (slower, same outcomes).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import struct
from collections.abc import Callable, Mapping
from typing import Any

import pamqp.frame
from aiormq import spec
from aiormq.abc import ChannelFrame
from aiormq.exceptions import DeliveryError
from pamqp.body import ContentBody
from pamqp.constants import DOMAIN_REGEX
from pamqp.header import ContentHeader

# aiormq releases (major.minor) whose Channel internals this module was written against and
# tested with; any other version takes the public path.
TESTED_AIORMQ = ("7.2",)

# What the fast path uses of an aiormq channel.
_CHANNEL_ATTRIBUTES = (
    "delivery_tag",
    "confirmations",
    "message_id_delivery_tag",
    "write_queue",
    "max_content_size",
    "number",
    "connection",
    "closing",
    "_on_confirm_frame",
)

_PERSISTENT = 2
_FRAME_END = b"\xce"
# Basic's class id, and the property flags of the properties relayer sets: headers (bit 13),
# delivery mode (bit 12) and message id (bit 7).
_BASIC = 60
_FLAGS = (1 << 13) | (1 << 12) | (1 << 7)
_HEADER_START = struct.Struct(">BHIHHQH")  # frame type 2, channel, size, class, weight, body, flags
_METHOD_START = struct.Struct(">BHIHHH")  # frame type 1, channel, size, class, method, reserved
_BODY_START = struct.Struct(">BHI")  # frame type 3, channel, size

Settle = Callable[[BaseException | None], None]
# The exchange names pamqp (so aiormq's public path) accepts.
_EXCHANGE_NAME = DOMAIN_REGEX["exchange-name"]


def installed_aiormq() -> str:
    try:
        return importlib.metadata.version("aiormq")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def fast_path_problem(channel: Any) -> str | None:
    """None if the fast path can be used on ``channel``, else why not (in words)."""
    version = installed_aiormq()
    if not any(version == tested or version.startswith(tested + ".") for tested in TESTED_AIORMQ):
        return (
            f"aiormq {version} is not one the fast path was tested with "
            f"({', '.join(TESTED_AIORMQ)}.x)"
        )
    missing = [name for name in _CHANNEL_ATTRIBUTES if not hasattr(channel, name)]
    if missing or not hasattr(channel.connection, "channels"):
        return f"aiormq {version}'s channel lacks {', '.join(missing) or 'connection.channels'}"
    return None


class Encoder:
    """Encodes publishes for one channel (its number and frame size), with the method frame of
    each (exchange, routing key) made once."""

    def __init__(self, channel_number: int, max_content_size: int) -> None:
        self.channel = channel_number
        self.max_content_size = max_content_size
        self._methods: dict[tuple[str, str], bytes] = {}

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        message_id: str,
        headers: Mapping[str, str],
    ) -> bytes:
        """The frames of one persistent, mandatory publish with these headers (all str) and
        the message id as the AMQP message_id. Raises ValueError for what AMQP cannot carry
        (a name or id over 255 bytes)."""
        method = self._methods.get((exchange, routing_key))
        if method is None:
            method = self._method(exchange, routing_key)
        table = bytearray()
        for name, value in sorted(headers.items()):  # in pamqp's order
            encoded_name = name.encode()
            encoded_value = value.encode()
            if len(encoded_name) > 128:  # AMQP field names (pamqp would cut it short)
                raise ValueError(f"header name of {len(encoded_name)} bytes (at most 128)")
            table += bytes((len(encoded_name),))
            table += encoded_name
            table += b"S"
            table += len(encoded_value).to_bytes(4, "big")
            table += encoded_value
        encoded_id = message_id.encode()
        if len(encoded_id) > 255:
            raise ValueError(f"message id of {len(encoded_id)} bytes (at most 255)")
        size = 14 + 4 + len(table) + 1 + 1 + len(encoded_id)
        parts = [
            method,
            _HEADER_START.pack(2, self.channel, size, _BASIC, 0, len(body), _FLAGS),
            len(table).to_bytes(4, "big"),
            bytes(table),
            bytes((_PERSISTENT, len(encoded_id))),
            encoded_id,
            _FRAME_END,
        ]
        chunk = self.max_content_size
        if len(body) <= chunk:
            if body:
                parts += (_BODY_START.pack(3, self.channel, len(body)), body, _FRAME_END)
        else:
            for start in range(0, len(body), chunk):
                piece = body[start : start + chunk]
                parts += (_BODY_START.pack(3, self.channel, len(piece)), piece, _FRAME_END)
        return b"".join(parts)

    def _method(self, exchange: str, routing_key: str) -> bytes:
        if len(exchange) > 127 or not _EXCHANGE_NAME.fullmatch(exchange):
            raise ValueError(
                f"exchange name {exchange[:40]!r} is not an AMQP exchange name (at most 127 of "
                "letters, digits, spaces and - _ . : @ # , / +)"
            )
        encoded_exchange, encoded_key = exchange.encode(), routing_key.encode()
        if len(encoded_exchange) > 255 or len(encoded_key) > 255:
            raise ValueError("exchange names and routing keys are at most 255 bytes")
        arguments = (
            bytes((len(encoded_exchange),))
            + encoded_exchange
            + bytes((len(encoded_key),))
            + encoded_key
            + b"\x01"  # mandatory, not immediate
        )
        method = (
            _METHOD_START.pack(1, self.channel, 6 + len(arguments), _BASIC, 40, 0)
            + arguments
            + _FRAME_END
        )
        if len(self._methods) < 10_000:
            self._methods[(exchange, routing_key)] = method
        return method


def reference_properties(message_id: str, headers: Mapping[str, str]) -> spec.Basic.Properties:
    """The properties the fast path encodes, as aiormq's public path takes them."""
    return spec.Basic.Properties(
        delivery_mode=_PERSISTENT, message_id=message_id, headers=dict(headers)
    )


def reference_encoding(
    channel_number: int,
    max_content_size: int,
    *,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: spec.Basic.Properties,
) -> bytes:
    """A publish encoded by pamqp (what aiormq writes): the public path checks with it that
    AMQP can carry a message, the tests compare the fast path's encoding with it."""
    frames: list[Any] = [
        spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True),
        ContentHeader(properties=properties, body_size=len(body)),
    ]
    frames.extend(
        ContentBody(body[start : start + max_content_size])
        for start in range(0, len(body), max_content_size)
    )
    return b"".join(pamqp.frame.marshal(frame, channel_number) for frame in frames)


class Pending:
    """One published message waiting for its confirm, in the channel's ``confirmations`` map.

    aiormq's return handling (a mandatory message no queue took) finds it there by message id
    and calls ``set_exception``; the confirm handler below calls ``settle`` directly. Only the
    members aiormq uses of a confirmation are here.
    """

    __slots__ = ("_done", "message_id", "settle", "tag", "tracker")

    def __init__(self, tracker: Confirms, tag: int, message_id: str, settle: Settle) -> None:
        self.tracker = tracker
        self.tag = tag
        self.message_id = message_id
        self.settle = settle
        self._done = False

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def set_result(self, _: object) -> None:
        self.finish(None)

    def set_exception(self, error: BaseException) -> None:
        self.finish(error)

    def finish(self, error: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        self.tracker.finished(self)
        self.settle(error)


class Confirms:
    """The publisher confirms of one channel, settled without a future per message.

    Installs itself as the channel's confirm-frame handler. A ``multiple`` ack settles every
    message up to its tag in one pass; a channel that closes fails every unconfirmed message
    with the reason it closed.
    """

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.unconfirmed = 0
        channel._on_confirm_frame = self._on_confirm_frame
        channel.closing.add_done_callback(self._closed)

    def track(self, message_id: str, settle: Settle) -> None:
        """Number the next publish of the channel (its delivery tag) and wait for its confirm.
        Called right before its frames are queued for writing, with no await in between."""
        channel = self.channel
        channel.delivery_tag += 1
        tag = channel.delivery_tag
        pending = Pending(self, tag, message_id, settle)
        channel.confirmations[tag] = pending
        channel.message_id_delivery_tag[message_id] = tag
        self.unconfirmed += 1

    def finished(self, pending: Pending) -> None:
        self.unconfirmed -= 1
        by_id = self.channel.message_id_delivery_tag
        if by_id.get(pending.message_id) == pending.tag:
            del by_id[pending.message_id]

    async def _on_confirm_frame(self, frame: Any) -> None:
        confirmations = self.channel.confirmations
        tag = frame.delivery_tag
        error = None if isinstance(frame, spec.Basic.Ack) else DeliveryError(None, frame)
        if not getattr(frame, "multiple", False):
            self._confirm(confirmations.pop(tag, None), error)
            return
        # Tags were inserted in ascending order; a returned message's entry was moved to the end
        # by aiormq (as a Returning placeholder), so look past the first larger tag only then.
        while confirmations:
            first = next(iter(confirmations))
            if first > tag:
                break
            self._confirm(confirmations.pop(first), error)
        stragglers = [key for key in confirmations if key <= tag]
        for key in stragglers:
            self._confirm(confirmations.pop(key), error)

    @staticmethod
    def _confirm(entry: Any, error: BaseException | None) -> None:
        if isinstance(entry, Pending):
            entry.finish(error)
        elif isinstance(entry, asyncio.Future) and not entry.done():
            # Not ours (aiormq's own placeholder or future): resolve it as aiormq would.
            if error is None:
                entry.set_result(None)
            else:
                entry.set_exception(error)

    def _closed(self, closing: asyncio.Future[Any]) -> None:
        reason: BaseException
        if closing.cancelled():
            reason = ConnectionError("the channel was closed")
        else:
            reason = closing.exception() or ConnectionError("the channel was closed")
        confirmations = self.channel.confirmations
        for tag in [key for key, entry in confirmations.items() if isinstance(entry, Pending)]:
            entry = confirmations.pop(tag)
            entry.finish(reason)


def write(writes: list[bytes], drained: asyncio.Future[None]) -> list[ChannelFrame]:
    """The frames of ``writes`` for aiormq's writer; ``drained`` resolves once the last has
    left the socket buffer."""
    last = len(writes) - 1
    return [
        ChannelFrame(payload, should_close=False, drain_future=drained if number == last else None)
        for number, payload in enumerate(writes)
    ]
