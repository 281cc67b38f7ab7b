"""How a lane scan ended, and when the lane is scanned next.

Every step of the relay hands its lanes on with a ``ScanResult``: a probe that already decides
a scan (``after_probe``: nothing to send, a future head, another live owner), a batch that sent
or rolled back, a scan that found no connection. The lane schedule reads ``next_in`` and the
store's stats count it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from relayer.store import LaneHead


class Scan(Enum):
    """How a lane scan ended; it decides when the lane is scanned next."""

    SENT = "sent"  # made progress: scan again at once
    EMPTY = "empty"  # nothing to send: poll_interval
    FUTURE = "future"  # head is future-dated: at its due time (or poll_interval, earlier)
    BUSY = "busy"  # another live owner holds the lane: at its expiry (or poll_interval)
    UNAVAILABLE = "unavailable"  # the broker is unreachable or silent: retry_backoff
    FAILED = "failed"  # database trouble: rolled back, retry_backoff
    WAITING = "waiting"  # no connection free in the worker's budget: nothing tried, again soon
    STOPPED = "stopped"  # the worker is stopping: nothing sent, not scanned again


@dataclass(frozen=True, slots=True)
class ScanResult:
    lane: int
    scan: Scan
    next_in: float
    sent: int = 0
    failed: int = 0
    gave_up: int = 0
    cut_short: bool = False
    detail: str = ""
    acked: Sequence[str] = ()  # ids (UUID text) deleted by this batch, ascending


def after_probe(head: LaneHead, member: str, poll: float) -> ScanResult | None:
    """The result of a scan that ``head`` (a probe's answer) already decides, or None if the
    lane must be sent: no head, another live owner's lease, or a future-dated head."""
    if not head.has_head:
        return ScanResult(head.lane, Scan.EMPTY, poll)
    if head.lease_live and head.owner not in (None, member):
        return ScanResult(head.lane, Scan.BUSY, min(max(head.lease_left, 0.01), poll))
    if head.future:
        return ScanResult(head.lane, Scan.FUTURE, min(max(head.due_in, 0.001), poll))
    return None
