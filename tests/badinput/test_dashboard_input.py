"""The dashboard answers a parameter a user can get wrong with a one-line 400: a time out of
range (``as_of``) and a NUL byte in any GET parameter or POST field, which no PostgreSQL text
can hold (it reached the database, which refused it: 503); a bulk run with one does not start."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from relayer.settings import StoreSettings
from tests.integration.dashboard.test_app import (  # noqa: F401  (fixtures)
    SAME,
    audit,
    operator,
    signed_in,
    store,
)
from tests.integration.relay.helpers import park

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

NOW = "2026-01-01T00:00:00%2B00:00"
GETS = [
    "/s/orders/parked?as_of=0001-01-01T00:00:00%2B14:00",
    "/s/orders/parked?as_of=9999-12-31T23:59:59-12:00",
    "/s/orders/parked?after_at=9999-12-31T23:59:59-12:00&after_key=k",
    "/s/orders/parked?error=a%00b",
    "/s/orders/parked?destination=a%00b",
    "/s/orders/parked?transport=a%00b",
    f"/s/orders/parked?after_at={NOW}&after_key=a%00b",
    "/s/orders/parked/key?key=a%00b",
    "/s/orders/audit?text=a%00b",
    "/s/orders/audit?action=a%00b",
]


def one_line_400(response: object, what: str) -> None:
    assert getattr(response, "status_code", None) == 400, (what, response)
    assert re.search(r'id="message">[^<\n]+</p>', response.text), what  # type: ignore[attr-defined]


def test_times_out_of_range_and_nul_bytes_in_a_query_get_400(operator: TestClient) -> None:  # noqa: F811
    for path in GETS:
        one_line_400(operator.get(path), path)


def test_nul_bytes_in_a_form_get_400_and_change_nothing(
    operator: TestClient,  # noqa: F811
    store: StoreSettings,  # noqa: F811
) -> None:
    head, attempts = park(store, "k1")
    headers = {**SAME, "X-Relayer-CSRF": signed_in(operator)}
    posts = {
        "/s/orders/queues/change": {"action": "pause", "queue": "a\x00b", "reason": "x"},
        "/s/orders/parked/change": {
            "key": "k1\x00",
            "action": "redrive",
            "head_id": str(head),
            "attempts": str(attempts),
            "reason": "x",
        },
        "/s/orders/parked/bulk": {"action": "drop", "expected": "1", "error": "re\x00"},
    }
    for path, form in posts.items():
        one_line_400(operator.post(path, data=form, headers=headers), path)
    assert audit(store) == []
    assert operator.get("/s/orders/parked/bulk/1").status_code == 400  # no run was started
