"""The last step of a lane scan: its result is counted, told to an operator when it needs one,
and handed to the lane schedule, which decides the lane's next scan.

A scan's own lane and every lane a widened batch took end here alike. A database or broker that
is down fails every lane the same way: its warnings go through one throttled log, one line per
cause per interval with a count.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from relayer.errors import StoreError
from relayer.observability.throttle import ThrottledLog, shape
from relayer.relay.results import Scan, ScanResult
from relayer.relay.schedule import LaneSchedule
from relayer.relay.stats import StoreStats

logger = logging.getLogger(__name__)

# How long a scan waits for a batch connection when the worker's budget has none free before
# it gives its slot back (Scan.WAITING, scanned again at once; nothing is counted).
CONNECTION_WAIT = 0.25


class ScanOutcomes:
    """Where every scan result of one store goes (``record``)."""

    def __init__(
        self,
        store: str,
        schedule: LaneSchedule,
        stats: StoreStats,
        *,
        backoff: float,
        connection_limit: Callable[[], int | None],
    ) -> None:
        self.store = store
        self.schedule = schedule
        self.stats = stats
        self.backoff = backoff
        self.connection_limit = connection_limit
        self.log = ThrottledLog(logger)

    def failed(self, lane: int, exc: StoreError) -> ScanResult:
        """The result of a scan whose probe or pooled connection failed (logged, throttled)."""
        detail = str(exc)
        self.log.warning(
            ("scan_failed", shape(detail)),
            "lane %s of store %s: %s; retrying in %.1f s",
            lane,
            self.store,
            detail,
            self.backoff,
            extra={"action": "scan_failed", "store": self.store, "lane": lane},
        )
        return ScanResult(lane, Scan.FAILED, self.backoff, detail=detail)

    def record(self, lane: int, result: ScanResult) -> None:
        """Count a lane scan's result, log what an operator must know, and schedule the lane's
        next scan from it (none once the worker is stopping)."""
        if result.scan is Scan.STOPPED:
            return
        self.stats.record(result)
        if result.scan is Scan.UNAVAILABLE:
            self.log.warning(
                ("unavailable", shape(result.detail)),
                "store %s: rows wait for a broker that cannot be used now: %s; no attempt is "
                "counted, their lanes are retried every %.1f s; check the broker if it lasts",
                self.store,
                result.detail,
                self.backoff,
                extra={"action": "transport_unavailable", "store": self.store, "lane": lane},
            )
        elif result.scan is Scan.WAITING:
            self.log.warning(
                ("waiting",),
                "store %s: no batch connection came free within %.2f s: every connection the "
                "worker may open (worker.max_connections = %s) is in use; lanes wait their turn "
                "(raise worker.max_connections, or serve fewer databases per process)",
                self.store,
                CONNECTION_WAIT,
                self.connection_limit(),
                extra={"action": "connections_busy", "store": self.store, "lane": lane},
            )
        elif result.scan is Scan.SENT and result.sent and logger.isEnabledFor(logging.DEBUG):
            # Asked first: the arguments (a dict for ``extra``) would be built for every lane.
            logger.debug(
                "lane %s: sent %s",
                lane,
                result.sent,
                extra={"action": "batch", "store": self.store, "lane": lane},
            )
        self.schedule.scanned(lane, result)
