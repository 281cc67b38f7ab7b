"""The read commands as a monitoring script runs them: ``--json`` everywhere with ISO 8601
timestamps, and ``status --check`` as a health check's exit status."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from relayer.settings import StoreSettings
from tests.acceptance.cli import relayer
from tests.integration.relay.helpers import park, write
from tests.integration.unordered.helpers import backdate

ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TIMESTAMP_FIELDS = re.compile(r".*_at$|^last_vacuum$")


def read_json(store: StoreSettings, *arguments: str, status: int = 0) -> Any:
    result = relayer(*arguments, "--json", store=store)
    assert result.returncode == status, result.stderr
    return json.loads(result.stdout)


def timestamps(document: Any) -> Iterator[tuple[str, Any]]:
    """Every (field, value) of a field that holds a timestamp, anywhere in ``document``."""
    if isinstance(document, dict):
        for field, value in document.items():
            if TIMESTAMP_FIELDS.match(field):
                yield field, value
            yield from timestamps(value)
    elif isinstance(document, list):
        for value in document:
            yield from timestamps(value)


def assert_iso(document: Any, *required: str) -> None:
    found = list(timestamps(document))
    assert {field for field, value in found if value is not None} >= set(required), found
    for field, value in found:
        assert value is None or ISO_UTC.fullmatch(value), (field, value)


def test_every_read_command_answers_json_with_iso_timestamps(store: StoreSettings) -> None:
    write(store, ["a", "b"], per_key=2)
    park(store, "stuck", error="refused by the broker")
    assert relayer("queue", "pause", "orders", "--by", "ops", store=store).returncode == 0

    status = read_json(store, "status", "orders")
    assert_iso(status, "read_at", "parked_at")
    assert status["store"] == "orders" and status["lanes"] == store.lanes
    assert status["total_pending"] == 6  # a, b twice each; the parked key's two rows
    assert sum(lane["rows"] for lane in status["pending"]) == 6
    assert status["parked"][0]["key"] == "stuck"
    assert status["parked"][0]["waiting_for_operator"] is True
    assert {"tables", "warnings", "oldest_due_age_seconds"} <= set(status["health"])
    assert "check" not in status

    parked = read_json(store, "parked", "list", "orders")
    assert_iso(parked, "read_at", "parked_at")
    assert parked["parked"] == status["parked"]  # one shape for a parked key

    queues = read_json(store, "queue", "status", "orders")
    assert_iso(queues, "read_at", "changed_at")
    (own,) = [queue for queue in queues["queues"] if queue["queue"] == "orders"]
    assert (own["paused"], own["changed_by"], own["limit"]) == (True, "ops", None)

    schema = read_json(store, "schema", "check", "orders")
    assert schema == {
        "store": "orders",
        "schema_version": schema["schema_version"],
        "lanes": store.lanes,
        "matches": True,
        "differences": [],
    }


def test_schema_check_json_lists_the_differences_and_exits_1(store: StoreSettings) -> None:
    other = relayer(
        "schema", "check", "orders", "--json", store=store.model_copy(update={"lanes": 8})
    )
    assert other.returncode == 1, other.stderr
    found = json.loads(other.stdout)
    assert found["matches"] is False
    assert found["differences"] == [
        {"subject": "lanes", "detail": f"recorded {store.lanes}, configured 8"}
    ]


def test_status_check_passes_until_a_key_is_parked_or_a_row_waits_too_long(
    store: StoreSettings,
) -> None:
    ids = write(store, ["a"], per_key=2)
    ok = relayer("status", "orders", "--check", "--max-lag", "1h", store=store)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.rstrip().endswith("check: ok")

    backdate(store, ids, seconds=120)
    late = relayer("status", "orders", "--max-lag", "30s", store=store)  # --check implied
    assert late.returncode == 1, late.stderr
    assert "check failed: store 'orders': the oldest due row has waited 12" in late.stdout
    assert "more than --max-lag 30 s" in late.stdout
    assert relayer("status", "orders", "--check", store=store).returncode == 0  # no bound

    park(store, "stuck")
    parked = relayer("status", "orders", "--check", "--json", store=store)
    assert parked.returncode == 1, parked.stderr
    check = json.loads(parked.stdout)["check"]
    assert check == {
        "ok": False,
        "max_lag_seconds": None,
        "problems": [
            "store 'orders': 1 parked key(s), 1 waiting for an operator "
            "(`relayer parked list orders`)"
        ],
    }
    assert relayer("status", "orders", store=store).returncode == 0  # no --check: just shown


@pytest.mark.parametrize("bound", ["soon", "0s", "-5"])
def test_status_max_lag_must_be_a_duration(store: StoreSettings, bound: str) -> None:
    result = relayer("status", "orders", "--max-lag", bound, store=store)
    assert result.returncode == 2
    assert "--max-lag" in result.stderr and "Traceback" not in result.stderr
