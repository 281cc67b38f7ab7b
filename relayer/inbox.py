"""The consumer inbox: handle each message once, in the consumer's own transaction.

Delivery is at-least-once, so a consumer sees some messages twice. ``Inbox.claim`` inserts the
message id (per consumer name) in the transaction that also holds the consumer's own changes:
the first claim is truthy, any later claim of the same id is a falsy ``DUPLICATE``, and a
rollback undoes the claim together with the work. Two consumers claiming the same id at once
take turns on the row: the second waits for the first transaction and sees a duplicate if it
committed.

With ``sequence_numbers`` on the producing store, every keyed message carries its key's number
(the ``relayer-sequence`` header) and the claim compares it with the last one this consumer
claimed for the key: ``IN_ORDER``, ``GAP`` (numbers are missing: lost, dropped, or still to
come), ``REORDERED`` (an earlier number arriving after a later one, or a duplicate whose entry
had expired) or ``NEW`` (the first number seen for the key is above 1: the consumer started
late, or its state for the key expired). The verdict is reported, never
acted on (nor logged): what to do with a gap is the consumer's decision.

``delivery_of`` reads the message id, ordering key and sequence from a confluent-kafka
``Message``, an aio-pika ``IncomingMessage`` or a relayer ``OutgoingMessage`` (duck-typed: this
module imports neither client).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from uuid import UUID

from relayer.errors import InvalidMessageError
from relayer.settings import StoreSettings
from relayer.store.caller import async_connection, require_transaction, sync_connection
from relayer.store.inbox import ClaimRow, InboxStatements
from relayer.transports.base import MESSAGE_ID_HEADER, ORDERING_KEY_HEADER, SEQUENCE_HEADER
from relayer.writer.sequences import sequence_of

MAX_CONSUMER_NAME = 200
_SYNC_NAMES = "claim / claim_message"
_ASYNC_NAMES = "claim_async / claim_message_async"


class Outcome(StrEnum):
    NEW = "new"  # first claim; nothing to compare (no sequence, or the key's first above 1)
    IN_ORDER = "in_order"  # the key's next number
    GAP = "gap"  # numbers between the last one and this one were not claimed (yet)
    REORDERED = "reordered"  # not above the key's last number: late, or an expired duplicate
    DUPLICATE = "duplicate"  # this consumer claimed this message id before


@dataclass(frozen=True, slots=True)
class Claim:
    """The result of a claim: truthy unless the message is a duplicate."""

    outcome: Outcome
    message_id: UUID
    sequence: int | None = None
    previous: int | None = None  # the key's last claimed number before this claim

    def __bool__(self) -> bool:
        return self.outcome is not Outcome.DUPLICATE

    @property
    def missing(self) -> range:
        """For a GAP, the numbers not claimed between the previous one and this one."""
        if self.outcome is Outcome.GAP and self.previous is not None and self.sequence:
            return range(self.previous + 1, self.sequence)
        return range(0)


@dataclass(frozen=True, slots=True)
class Delivery:
    """What relayer stamped on a message: its outbox id, ordering key and sequence number."""

    message_id: UUID
    key: str | None = None
    sequence: int | None = None


def delivery_of(message: Any) -> Delivery:
    """The relayer fields of a confluent-kafka Message, an aio-pika IncomingMessage or an
    OutgoingMessage (InvalidMessageError if it has no relayer message id)."""
    raw_headers = getattr(message, "headers", None)
    own_id: object = getattr(message, "id", None)
    if callable(raw_headers):  # confluent_kafka.Message: headers() is a list of pairs
        headers = _text_headers(raw_headers() or ())
        message_id: object = headers.get(MESSAGE_ID_HEADER)
        key = headers.get(ORDERING_KEY_HEADER)
        if key is None and callable(getattr(message, "key", None)):
            key = _text(message.key())
    elif isinstance(own_id, UUID):  # relayer's OutgoingMessage (MemoryTransport)
        headers = _text_headers((raw_headers or {}).items())
        message_id, key = own_id, message.key
    else:  # aio_pika.IncomingMessage: AMQP message_id property, headers table
        headers = _text_headers((raw_headers or {}).items())
        message_id = getattr(message, "message_id", None) or headers.get(MESSAGE_ID_HEADER)
        key = headers.get(ORDERING_KEY_HEADER)
    return Delivery(_message_id(message_id), key, sequence_of(headers.get(SEQUENCE_HEADER)))


class Inbox:
    """Claims of one store's inbox (``<prefix>inbox``), in the caller's transaction.

    ``conn`` is a psycopg Connection/AsyncConnection or an SQLAlchemy Session, Connection,
    AsyncSession or AsyncConnection (psycopg driver), like for ``Outbox.write``.
    """

    def __init__(self, store: StoreSettings) -> None:
        self.store = store
        self._statements = InboxStatements(store)

    def __repr__(self) -> str:
        return f"Inbox(store={self.store.name!r})"

    def claim(
        self,
        conn: Any,
        message_id: UUID | str,
        consumer: str,
        *,
        key: str | None = None,
        sequence: int | None = None,
    ) -> Claim:
        """Claim ``message_id`` for ``consumer``; falsy (DUPLICATE) if it was claimed before."""
        params = _params(message_id, consumer, key, sequence)
        connection = sync_connection(conn, _ASYNC_NAMES, _SYNC_NAMES)
        require_transaction(connection, "inbox entry")
        return _verdict(params, self._statements.claim(connection, params))

    def claim_message(self, conn: Any, message: Any, consumer: str) -> Claim:
        """``claim`` with the id, key and sequence read from a broker message."""
        delivery = delivery_of(message)
        return self.claim(
            conn, delivery.message_id, consumer, key=delivery.key, sequence=delivery.sequence
        )

    async def claim_async(
        self,
        conn: Any,
        message_id: UUID | str,
        consumer: str,
        *,
        key: str | None = None,
        sequence: int | None = None,
    ) -> Claim:
        params = _params(message_id, consumer, key, sequence)
        connection = await async_connection(conn, _SYNC_NAMES, _ASYNC_NAMES)
        require_transaction(connection, "inbox entry")
        return _verdict(params, await self._statements.claim_async(connection, params))

    async def claim_message_async(self, conn: Any, message: Any, consumer: str) -> Claim:
        delivery = delivery_of(message)
        return await self.claim_async(
            conn, delivery.message_id, consumer, key=delivery.key, sequence=delivery.sequence
        )


def _verdict(params: Mapping[str, Any], row: ClaimRow) -> Claim:
    claimed, previous = row
    message_id, sequence = params["message_id"], params["sequence"]
    if not claimed:
        return Claim(Outcome.DUPLICATE, message_id, sequence)
    if sequence is None or (previous is None and sequence > 1):
        return Claim(Outcome.NEW, message_id, sequence)
    previous = 0 if previous is None else previous  # a key's first number is 1
    if sequence == previous + 1:
        return Claim(Outcome.IN_ORDER, message_id, sequence, previous)
    outcome = Outcome.GAP if sequence > previous else Outcome.REORDERED
    return Claim(outcome, message_id, sequence, previous)


def _params(message_id: object, consumer: object, key: object, sequence: object) -> dict[str, Any]:
    if not isinstance(consumer, str) or not 1 <= len(consumer) <= MAX_CONSUMER_NAME:
        raise InvalidMessageError(
            "consumer", consumer, f"must be a str of 1 to {MAX_CONSUMER_NAME} characters"
        )
    if key is not None and (not isinstance(key, str) or not key or "\x00" in key):
        raise InvalidMessageError("key", key, "must be a non-empty str without NUL, or None")
    if sequence is not None:
        if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 1:
            raise InvalidMessageError("sequence", sequence, "must be an integer >= 1, or None")
        if key is None:
            raise InvalidMessageError("sequence", sequence, "needs the key it numbers (key=...)")
    return {
        "message_id": _message_id(message_id),
        "consumer": consumer,
        "key": key,
        "sequence": sequence,
    }


def _message_id(value: object) -> UUID:
    if isinstance(value, UUID):
        return value
    text = _text(value)
    if text:
        try:
            return UUID(text)
        except ValueError:
            pass
    raise InvalidMessageError(
        "message_id",
        value,
        f"must be a UUID, as relayer sends in the {MESSAGE_ID_HEADER!r} header (or the AMQP "
        "message_id); was the message sent by relayer?",
    )


def _text(value: object) -> str | None:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _text_headers(pairs: Iterable[tuple[Any, Any]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in pairs:
        text = _text(value)
        if isinstance(name, str) and text is not None:
            headers[name] = text
    return headers
