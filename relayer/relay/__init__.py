"""The relay step: the ordered protocol of docs/protocol.md, one module per step.

- ``scanning``: which owned lanes have a due head (read-only probes);
- ``coalescing``: lanes asked for in the same event-loop turn are served together, and lanes
  woken within one ``wake_linger`` share a batch;
- ``batch``: the lane batch (lock, read, send, fenced outcomes, commit);
- ``pipeline``: the send pipeline of one batch (per-row outcomes, per-key order).
"""

from relayer.relay.batch import (
    BATCH_LANES,
    SPREAD_BATCH_LANES,
    WIDE_BATCH_LANES,
    LaneRelay,
    Scan,
    ScanResult,
)
from relayer.relay.coalescing import Coalescer, WakeWindow
from relayer.relay.pipeline import BatchSender, SendReport, send_batch
from relayer.relay.scanning import Prober

__all__ = [
    "BATCH_LANES",
    "SPREAD_BATCH_LANES",
    "WIDE_BATCH_LANES",
    "BatchSender",
    "Coalescer",
    "LaneRelay",
    "Prober",
    "Scan",
    "ScanResult",
    "SendReport",
    "WakeWindow",
    "send_batch",
]
