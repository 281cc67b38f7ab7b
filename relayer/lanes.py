"""Ordering keys to lanes: FNV-1a 32-bit over UTF-8, modulo the lane count.

Every writer and worker of a store must agree on this function forever, so it is pinned by
the vectors in the protocol (``""`` -> 0x811c9dc5, ``"a"`` -> 0xe40c292c,
``"foobar"`` -> 0xbf9cf968) and by the unit tests.
"""

from __future__ import annotations

from functools import lru_cache

FNV_OFFSET_BASIS = 2166136261
FNV_PRIME = 16777619
MAX_LANES = 65_536
# The lane of rows without an ordering key (unordered rows are never sent by a lane scan).
UNORDERED_LANE = -1


def fnv1a_32(data: bytes) -> int:
    """The 32-bit FNV-1a hash of ``data``."""
    value = FNV_OFFSET_BASIS
    for byte in data:
        value ^= byte
        value = (value * FNV_PRIME) & 0xFFFFFFFF
    return value


@lru_cache(maxsize=65_536)
def key_hash(key: str) -> int:
    """``fnv1a_32`` of ``key``'s UTF-8 form, remembered for the last 65,536 keys (``lane_for``
    without its argument checks, for a caller that has checked them: the writer)."""
    return fnv1a_32(key.encode("utf-8"))


def lane_for(key: str, lanes: int) -> int:
    """The lane of ``key`` in a store with ``lanes`` lanes (1-65,536)."""
    if not isinstance(key, str):
        raise TypeError(f"ordering key must be str, got {type(key).__name__}")
    if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= MAX_LANES:
        raise ValueError(f"lanes: {lanes!r} is invalid: must be an integer from 1 to {MAX_LANES}")
    return key_hash(key) % lanes
