"""Per-key sequence numbers, stamped by the writer when a store sets ``sequence_numbers``.

Each ordering key has a counter row. A write upserts it (``reserve_sequences``, run by the
gateway: relayer.store.outbox) in the caller's transaction, which locks the row until that
transaction ends: a second writer of the same key waits for the first one's commit or
rollback. So numbers are gapless (a rollback gives its numbers back) and follow commit order
per key, at the price of serializing writers of one key and one more round trip per write.
The number travels as the ``relayer-sequence`` header; the consumer's inbox compares it with
the last one it saw (``relayer.inbox``).

The outbox id is taken after the counter's lock, so id order (the relay's sending order) agrees
with sequence order, except for writers on different hosts whose clocks disagree or that commit
within the same millisecond; the inbox then reports the inversion instead of hiding it.
"""

from __future__ import annotations

from relayer.transports.base import SEQUENCE_HEADER


def stamped_json(headers: bytes, sequence: int) -> bytes:
    """``headers`` (a JSON object the writer encoded) with the sequence header added."""
    entry = f'"{SEQUENCE_HEADER}":"{sequence}"'.encode()
    if headers.strip() == b"{}":
        return b"{" + entry + b"}"
    # The writer's own compact encoding always ends with the object's closing brace.
    return headers[:-1] + b"," + entry + b"}"


def sequence_of(value: object) -> int | None:
    """The sequence number in a header value (str or bytes), or None when it is not one."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("ascii", "replace")
    if isinstance(value, str) and value.isascii() and value.isdigit() and 0 < len(value) <= 19:
        number = int(value)
        return number if number >= 1 else None
    return None
