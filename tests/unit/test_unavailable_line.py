"""The ``transport_unavailable`` line of the relay (docs/observability.md): what the rows wait
for, that no attempt is counted (said once, whatever the reason says), and what to do."""

from __future__ import annotations

import logging

import pytest

from relayer.relay.batch import _NO_ACK
from relayer.relay.outcomes import ScanOutcomes
from relayer.relay.results import Scan, ScanResult
from relayer.relay.schedule import LaneSchedule
from relayer.relay.stats import StoreStats


def test_a_batch_without_acknowledgements_says_once_that_no_attempt_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    schedule = LaneSchedule("orders", lambda: 0.0, lambda: frozenset({3}))
    outcomes = ScanOutcomes(
        "orders", schedule, StoreStats(), backoff=0.5, connection_limit=lambda: None
    )
    with caplog.at_level(logging.WARNING, logger="relayer.relay.outcomes"):
        outcomes.record(3, ScanResult(3, Scan.UNAVAILABLE, 0.5, detail=_NO_ACK))
    [record] = caplog.records
    assert record.action == "transport_unavailable"  # type: ignore[attr-defined]
    text = record.getMessage()
    assert text.count("no attempt is counted") == 1, text
    assert "check the broker" in text, text
