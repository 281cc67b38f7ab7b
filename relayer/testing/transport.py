"""The MemoryTransport of a user's tests, with assertions on what was sent."""

from __future__ import annotations

from collections.abc import Sequence

from relayer.transports.base import OutgoingMessage
from relayer.transports.memory import MemoryTransport

# How many messages an assertion's failure lists.
_SHOWN = 10


class RecordingTransport(MemoryTransport):
    """A :class:`~relayer.transports.memory.MemoryTransport` (every fault injection included)
    that answers questions about what its destinations accepted, in acceptance order."""

    def sent_to(self, destination: str) -> list[OutgoingMessage]:
        """The messages ``destination`` accepted."""
        return self.received(destination)

    def sent(
        self,
        destination: str | None = None,
        *,
        key: str | None = None,
        body: bytes | None = None,
    ) -> list[OutgoingMessage]:
        """The accepted messages that match every filter given (None: any)."""
        messages = self.received_all() if destination is None else self.received(destination)
        return [
            message
            for message in messages
            if (key is None or message.key == key) and (body is None or message.body == body)
        ]

    def bodies(self, destination: str) -> list[bytes]:
        """The bodies ``destination`` accepted."""
        return [message.body for message in self.received(destination)]

    def assert_sent(
        self,
        destination: str | None = None,
        *,
        key: str | None = None,
        body: bytes | None = None,
        count: int | None = None,
    ) -> list[OutgoingMessage]:
        """Assert that messages matching the filters were sent: exactly ``count`` of them, or
        at least one without it. Returns them."""
        found = self.sent(destination, key=key, body=body)
        if (count is None and found) or len(found) == count:
            return found
        wanted = "at least one message" if count is None else f"{count} message(s)"
        raise AssertionError(
            f"expected {wanted}{_filters(destination, key, body)}, found {len(found)}; "
            f"{self._summary()}"
        )

    def assert_nothing_sent(self, destination: str | None = None) -> None:
        """Assert that no message was sent (to ``destination``, if given)."""
        found = self.sent(destination)
        if found:
            raise AssertionError(
                f"expected no message{_filters(destination, None, None)}, found {len(found)}; "
                f"{self._summary()}"
            )

    def clear(self) -> None:
        """Forget what was sent so far (faults stay as they are)."""
        self.forget()

    def _summary(self) -> str:
        messages = self.received_all()
        if not messages:
            return "nothing was sent"
        shown = ", ".join(_describe(message) for message in messages[:_SHOWN])
        more = f" and {len(messages) - _SHOWN} more" if len(messages) > _SHOWN else ""
        return f"sent: {shown}{more}"


def _filters(destination: str | None, key: str | None, body: bytes | None) -> str:
    parts: Sequence[str] = [
        text
        for text in (
            f"to {destination!r}" if destination is not None else "",
            f"with key {key!r}" if key is not None else "",
            f"with body {_short(body)}" if body is not None else "",
        )
        if text
    ]
    return " " + " ".join(parts) if parts else ""


def _describe(message: OutgoingMessage) -> str:
    return f"{message.destination!r} key={message.key!r} body={_short(message.body)}"


def _short(body: bytes) -> str:
    text = repr(body)
    return text if len(text) <= 40 else text[:37] + "..."
