"""The NATS transport's acknowledgements: which published messages wait for JetStream's answer.

Each publish carries a reply subject of its own under one inbox the transport subscribes to
(``<inbox>.<number>``); JetStream answers there with a PubAck, an error, or the server with
"no responders" when no stream captures the subject. The answer settles the message straight
from the subscription's callback, with no future per message. (nats-py's ``publish_async``
does the same, but its reply handler raises JetStream's errors instead of failing the message's
future, which then waits forever.)

Also here: the copy refused while an earlier copy of the same message still waits (the
moment a stall is told, ``relayer.transports.stalls``), the acknowledgements failed when the
connection is lost or they are older than ``ack_timeout``, and the room left for more.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from typing import Any

import nats.errors
import nats.js.errors

from relayer.transports.base import TransportUnavailableError
from relayer.transports.nats import outcomes
from relayer.transports.publishing import Outcome
from relayer.transports.stalls import StallNotice

# The status header of the server's answer when nothing subscribes to a subject.
_STATUS = "Status"
_NO_RESPONDERS = "503"


class _Waiting:
    """One published message waiting for JetStream's acknowledgement."""

    __slots__ = ("message_id", "sent_at", "settle", "subject", "token")

    def __init__(self, token: str, message_id: str, subject: str, settle: Outcome) -> None:
        self.token = token
        self.message_id = message_id
        self.subject = subject
        self.settle = settle
        self.sent_at = time.monotonic()


class Acknowledgements:
    """The messages of one transport that wait for JetStream's acknowledgement (at most
    ``limit`` before a publish waits for room)."""

    def __init__(self, limit: int, notice: StallNotice) -> None:
        self.limit = limit
        self.inbox = ""  # the reply subjects' prefix, set by ``listen``
        self._notice = notice
        self._numbers = itertools.count()
        self._by_token: dict[str, _Waiting] = {}
        self._by_message: dict[str, _Waiting] = {}  # oldest first
        self._acknowledged_at = time.monotonic()
        self._room = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._by_message)

    async def listen(self, connection: Any) -> None:
        """Subscribe to this transport's reply subjects on ``connection`` (nats-py subscribes
        again by itself after a reconnect)."""
        self.inbox = connection.new_inbox()
        await connection.subscribe(self.inbox + ".*", cb=self._answered)

    def full(self) -> bool:
        return len(self._by_message) >= self.limit

    async def room(self) -> None:
        """Wait until fewer than ``limit`` messages wait."""
        while self.full():
            self._room.clear()
            await self._room.wait()

    def refuse_copy(self, message_id: str) -> TransportUnavailableError | None:
        """The error for a copy of a message whose earlier copy still waits, else None."""
        if message_id not in self._by_message:
            return None
        self._notice.refused(len(self._by_message), self._acknowledged_at)
        return outcomes.still_unacknowledged(message_id)

    def reply_subject(self, message_id: str, subject: str, settle: Outcome) -> str:
        """Wait for the answer to the message about to be published; its reply subject."""
        if not self._by_message:  # nothing waited for an acknowledgement: nothing is overdue
            self._acknowledged_at = time.monotonic()
            self._idle.clear()
        token = str(next(self._numbers))
        waiting = _Waiting(token, message_id, subject, settle)
        self._by_token[token] = waiting
        self._by_message[message_id] = waiting
        return f"{self.inbox}.{token}"

    def unsent(self, message_id: str) -> None:
        """The publish of ``message_id`` failed before it was sent: nothing to wait for."""
        waiting = self._by_message.get(message_id)
        if waiting is not None:
            self._forget(waiting)

    async def _answered(self, message: Any) -> None:
        waiting = self._by_token.get(message.subject.rpartition(".")[2])
        if waiting is None:
            return  # answered after it was failed (lost, timed out): its row goes again
        self._forget(waiting)
        error = _error_of(message)
        if error is None:
            self._acknowledged_at = time.monotonic()
            if self._notice.since is not None:
                self._notice.acknowledged()
            waiting.settle(None)
        else:
            waiting.settle(outcomes.refused(error, waiting.subject))

    def fail(self, error: TransportUnavailableError, *, older_than: float = 0.0) -> int:
        """Fail the messages that waited longer than ``older_than`` seconds; how many."""
        now = time.monotonic()
        failed = 0
        for waiting in list(self._by_message.values()):
            if now - waiting.sent_at < older_than:
                break  # oldest first: the rest are younger
            self._forget(waiting)
            waiting.settle(error)
            failed += 1
        return failed

    async def settled(self, seconds: float) -> int:
        """Wait up to ``seconds`` for every message to be answered; how many still wait."""
        if self._by_message:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), max(seconds, 0.0))
        return len(self._by_message)

    def _forget(self, waiting: _Waiting) -> None:
        del self._by_token[waiting.token]
        if self._by_message.get(waiting.message_id) is waiting:
            del self._by_message[waiting.message_id]
        if len(self._by_message) < self.limit:
            self._room.set()
        if not self._by_message:
            self._idle.set()


def _error_of(message: Any) -> Exception | None:
    """None for a PubAck (``duplicate``: an earlier copy was stored), else the error."""
    headers = message.headers or {}
    if headers.get(_STATUS) == _NO_RESPONDERS:
        return nats.js.errors.NoStreamResponseError()
    try:
        answer = json.loads(message.data)
    except ValueError:
        return nats.errors.ProtocolError(f"JetStream answered {message.data[:80]!r}")
    error = answer.get("error") if isinstance(answer, dict) else None
    if error is None:
        return None
    kind = (
        nats.js.errors.ServiceUnavailableError
        if error.get("code") == 503
        else nats.js.errors.APIError
    )
    return kind(
        code=error.get("code"),
        err_code=error.get("err_code"),
        description=error.get("description"),
    )
