"""The worker side: a process that serves stores (``Worker``) and the maintenance jobs it runs
beside their relays (``maintenance``: unordered recovery, retention)."""

from relayer.worker.worker import (
    FIRST_PROBE_LANES,
    SPREAD_LANES,
    StoreRuntime,
    StoreStats,
    Worker,
    probe_parts,
)

__all__ = [
    "FIRST_PROBE_LANES",
    "SPREAD_LANES",
    "StoreRuntime",
    "StoreStats",
    "Worker",
    "probe_parts",
]
