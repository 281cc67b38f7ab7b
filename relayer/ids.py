"""UUIDv7 message ids (RFC 9562), strictly increasing within a process.

The 48-bit Unix millisecond timestamp leads, so ids sort by creation time in PostgreSQL's
``uuid`` order (bytewise). Within one millisecond the 74 bits after the version and variant
fields act as a counter that starts at a random value with headroom, so a process never issues
two ids out of order, even from several threads. If the counter runs out (or the wall clock
steps back) the timestamp is carried forward instead of going backwards.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from uuid import UUID, SafeUUID

_TAIL_BITS = 74  # 12 bits of rand_a + 62 bits of rand_b
_TAIL_MAX = (1 << _TAIL_BITS) - 1
_FRESH_MASK = (1 << (_TAIL_BITS - 1)) - 1
_TAIL_BYTES = 10
_RANDOM_TAILS = 64


class _Clock:
    """The last (millisecond, counter) pair issued; guarded by a lock for threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_ms = 0
        self.last_tail = 0
        self._random = b""  # the OS's random bytes not used yet, from _taken on
        self._taken = 0

    def next(self) -> tuple[int, int]:
        with self.lock:
            now_ms = time.time_ns() // 1_000_000
            if now_ms > self.last_ms:
                self.last_ms, self.last_tail = now_ms, self._fresh_tail()
            elif self.last_tail < _TAIL_MAX:
                self.last_tail += 1
            else:
                self.last_ms, self.last_tail = self.last_ms + 1, self._fresh_tail()
            return self.last_ms, self.last_tail

    def block(self, count: int) -> tuple[int, int]:
        """Reserve ``count`` consecutive values; returns (millisecond, first tail)."""
        with self.lock:
            now_ms = time.time_ns() // 1_000_000
            if now_ms > self.last_ms:
                self.last_ms, self.last_tail = now_ms, self._fresh_tail()
            else:
                self.last_tail += 1
            if self.last_tail + count - 1 > _TAIL_MAX:
                self.last_ms, self.last_tail = self.last_ms + 1, self._fresh_tail()
            first = self.last_tail
            self.last_tail += count - 1
            return self.last_ms, first

    def _fresh_tail(self) -> int:
        """A random start for a new millisecond's counter, under the lock. The OS's random
        bytes are read for _RANDOM_TAILS tails at once: a process writing a row a millisecond
        or slower starts a new millisecond at nearly every id, and paid a system call each."""
        at = self._taken
        if at >= len(self._random):
            self._random, at = os.urandom(_TAIL_BYTES * _RANDOM_TAILS), 0
        self._taken = at + _TAIL_BYTES
        # The top bit clear, so that a millisecond has at least 2**73 increments of headroom.
        return int.from_bytes(self._random[at : at + _TAIL_BYTES], "big") & _FRESH_MASK

    def forget_random(self) -> None:
        """In a forked child: the parent's unused random bytes are not reused (the two
        processes would start their milliseconds' counters alike)."""
        self._random, self._taken = b"", 0


_clock = _Clock()
os.register_at_fork(after_in_child=_clock.forget_random)
_new_uuid = object.__new__
_set = object.__setattr__
_UNKNOWN_SAFETY = SafeUUID.unknown  # what UUID(int=...) records


def _compose(ms: int, tail: int) -> UUID:
    rand_a = tail >> 62
    rand_b = tail & ((1 << 62) - 1)
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    # UUID(int=value) checks arguments this function cannot get wrong, at several times the
    # cost of the rest of an id: the two attributes UUID.__init__ would set, set directly.
    made = _new_uuid(UUID)
    _set(made, "int", value)
    _set(made, "is_safe", _UNKNOWN_SAFETY)
    return made


def uuid7() -> UUID:
    """A new UUIDv7, greater than every id this process issued before."""
    return _compose(*_clock.next())


def uuid7_block(count: int) -> list[UUID]:
    """``count`` increasing UUIDv7s reserved at once (cheaper than ``count`` calls)."""
    return list(uuid7_iter(count))


def uuid7_iter(count: int) -> Iterator[UUID]:
    """``count`` increasing UUIDv7s reserved now and made one by one as they are taken."""
    if count <= 0:
        return
    ms, first = _clock.block(count)
    for tail in range(first, first + count):
        yield _compose(ms, tail)


def uuid7_time_ms(value: UUID) -> int:
    """The Unix millisecond timestamp inside a UUIDv7."""
    return value.int >> 80
