"""The dashboard's application against real PostgreSQL, through Starlette's TestClient:
read-only refusals, cross-site and CSRF checks, the stale guard, audit rows, no secret in any
response."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

from relayer.dashboard import Access, create_app, parse_token
from relayer.operations import parked
from relayer.settings import StoreSettings
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import park

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SECRET = "s3cretPassw0rd"
BROKER_SECRET = "brokerPassw0rd"
TOKEN = "ops:0123456789abcdef-token"
HOST = "testserver"
SAME = {"Origin": f"http://{HOST}", "Sec-Fetch-Site": "same-origin"}


def with_password(dsn: str) -> str:
    """The test DSN with a password (trust authentication ignores it): it must never show."""
    return dsn.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")


@pytest.fixture
async def store(pg_dsn: str) -> StoreSettings:
    settings = make_store(
        with_password(pg_dsn),
        transports={
            "rabbit": {"type": "rabbitmq", "url": f"amqp://guest:{BROKER_SECRET}@127.0.0.1/"}
        },
        default_transport="rabbit",
    )
    await apply_schema(settings)
    return settings


def audit(store: StoreSettings) -> list[tuple[Any, ...]]:
    with psycopg.connect(store.require_dsn()) as conn:
        return conn.execute(
            f"SELECT source, actor, action, ordering_key, outcome, rows_affected, reason "
            f"FROM {store.table_prefix}audit ORDER BY id"
        ).fetchall()


def client_for(store: StoreSettings, *, token: bool) -> Iterator[TestClient]:
    tokens = [parse_token("test", TOKEN)] if token else []
    app = create_app([store], Access(tokens, read_only=False, allowed_hosts={HOST}), interval=1)
    with TestClient(app) as client:
        sampler = app.state.dashboard.contexts[store.name].sampler
        deadline = time.monotonic() + 10
        while sampler.snapshot is None and time.monotonic() < deadline:
            time.sleep(0.05)
        yield client


@pytest.fixture
def read_only(store: StoreSettings) -> Iterator[TestClient]:
    yield from client_for(store, token=False)


@pytest.fixture
def operator(store: StoreSettings) -> Iterator[TestClient]:
    yield from client_for(store, token=True)


def signed_in(client: TestClient) -> str:
    """Sign in; returns the session's CSRF token (from the page's hx-headers)."""
    response = client.post(
        "/login",
        data={"token": TOKEN.split(":", 1)[1], "next": "/s/orders/parked"},
        headers=SAME,
        follow_redirects=True,
    )
    assert response.status_code == 200
    match = re.search(r'"X-Relayer-CSRF": "([^"]+)"', response.text)
    assert match, "the signed-in page carries its CSRF token"
    return match[1]


def test_read_only_answers_403_to_every_change_and_renders_no_button(
    read_only: TestClient, store: StoreSettings
) -> None:
    head, attempts = park(store, "k1")
    page = read_only.get("/s/orders/parked")
    assert page.status_code == 200 and "k1" in page.text
    assert "Redrive…" not in page.text and "read-only" in page.text
    for path, form in (
        ("/s/orders/parked/change", {"key": "k1", "action": "redrive", "head_id": str(head)}),
        ("/s/orders/queues/change", {"action": "pause", "reason": "x"}),
        ("/s/orders/parked/bulk", {"action": "drop", "expected": "1"}),
    ):
        response = read_only.post(path, data=form, headers=SAME)
        assert response.status_code == 403, path
        assert "read-only" in response.text
    assert len(audit(store)) == 0
    assert attempts == 1


def test_cross_site_requests_and_missing_csrf_are_refused(
    operator: TestClient, store: StoreSettings
) -> None:
    head, attempts = park(store, "k1")
    form = {
        "key": "k1",
        "action": "redrive",
        "head_id": str(head),
        "attempts": str(attempts),
        "reason": "x",
    }
    csrf = signed_in(operator)
    refused = {
        "cross-site fetch": {"Sec-Fetch-Site": "cross-site", "X-Relayer-CSRF": csrf},
        "foreign origin": {"Origin": "http://evil.example", "X-Relayer-CSRF": csrf},
        "no CSRF header": dict(SAME),
        "wrong CSRF header": {**SAME, "X-Relayer-CSRF": "forged"},
    }
    for name, headers in refused.items():
        response = operator.post("/s/orders/parked/change", data=form, headers=headers)
        assert response.status_code == 403, name
    foreign_host = operator.get("/s/orders/overview", headers={"Host": "attacker.example"})
    assert foreign_host.status_code == 403  # DNS rebinding
    assert audit(store) == []
    accepted = operator.post(
        "/s/orders/parked/change", data=form, headers={**SAME, "X-Relayer-CSRF": csrf}
    )
    assert accepted.status_code == 200


def test_a_wrong_token_does_not_sign_in(operator: TestClient) -> None:
    response = operator.post("/login", data={"token": "not-the-token-at-all"}, headers=SAME)
    assert response.status_code == 403
    assert "relayer_dashboard" not in response.headers.get("set-cookie", "")


def test_stale_guard_answers_409_and_changes_nothing(
    operator: TestClient, store: StoreSettings
) -> None:
    head, attempts = park(store, "k1")
    csrf = signed_in(operator)
    headers = {**SAME, "X-Relayer-CSRF": csrf}
    form = {"key": "k1", "action": "drop", "scope": "key", "head_id": str(head), "reason": "old"}
    stale = operator.post(
        "/s/orders/parked/change", data={**form, "attempts": str(attempts + 1)}, headers=headers
    )
    assert stale.status_code == 409
    assert "changed" in stale.text
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute("SELECT count(*) FROM orders_outbox").fetchone()
    assert row == (2,)
    dropped = operator.post(
        "/s/orders/parked/change", data={**form, "attempts": str(attempts)}, headers=headers
    )
    assert dropped.status_code == 200
    gone = operator.post(
        "/s/orders/parked/change", data={**form, "attempts": str(attempts)}, headers=headers
    )
    assert gone.status_code == 409
    assert [row[4] for row in audit(store)] == ["stale", "applied", "not_parked"]
    assert audit(store)[1] == ("dashboard", "ops", "drop", "k1", "applied", 2, "old")


def test_every_action_writes_an_audit_row(operator: TestClient, store: StoreSettings) -> None:
    head, attempts = park(store, "k1")
    park(store, "k2")
    csrf = signed_in(operator)
    headers = {**SAME, "X-Relayer-CSRF": csrf}
    redrive = operator.post(
        "/s/orders/parked/change",
        data={
            "key": "k1",
            "action": "redrive",
            "head_id": str(head),
            "attempts": str(attempts),
            "reason": "fixed",
        },
        headers=headers,
    )
    assert redrive.status_code == 200
    for action, extra in (("pause", {}), ("limit", {"limit": "3"}), ("resume", {})):
        response = operator.post(
            "/s/orders/queues/change",
            data={"action": action, "reason": f"{action} it", **extra},
            headers=headers,
        )
        assert response.status_code == 200, response.text
    bulk = operator.post(
        "/s/orders/parked/bulk",
        data={"action": "drop", "expected": "1", "reason": "cleanup"},
        headers=headers,
    )
    assert bulk.status_code == 200
    deadline = time.monotonic() + 10
    while len(audit(store)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert audit(store) == [
        ("dashboard", "ops", "redrive", "k1", "applied", 2, "fixed"),
        ("dashboard", "ops", "drop", "k2", "applied", 2, "cleanup"),
    ]
    with psycopg.connect(store.require_dsn()) as conn:
        events = conn.execute(
            "SELECT action, actor, reason FROM orders_queue_events ORDER BY id"
        ).fetchall()
    assert events == [
        ("pause", "dashboard:ops", "pause it"),
        ("limit", "dashboard:ops", "limit it"),
        ("resume", "dashboard:ops", "resume it"),
    ]
    trail = operator.get("/s/orders/audit")
    assert "fixed" in trail.text and "pause it" in trail.text


async def test_cli_parked_changes_are_audited_with_the_cli_as_source(
    store: StoreSettings,
) -> None:
    park(store, "k1")
    async with await psycopg.AsyncConnection.connect(store.require_dsn(), autocommit=True) as conn:
        changes = await parked.redrive(conn, store, "k1")
    assert [(change.key, change.rows) for change in changes] == [("k1", 2)]
    [row] = audit(store)
    assert row[0] == "cli" and row[2:5] == ("redrive", "k1", "applied")


def test_no_secret_in_any_page_or_stream(operator: TestClient, store: StoreSettings) -> None:
    park(store, "k1", error=f"cannot reach amqp://guest:{BROKER_SECRET}@broker/")
    csrf = signed_in(operator)
    head = audit_free_head(store)
    paths = [
        "/s/orders/overview",
        "/s/orders/lanes",
        f"/s/orders/lanes/{head[1]}",
        "/s/orders/parked",
        "/s/orders/parked?error=cannot",
        "/s/orders/parked/key?key=k1",
        f"/s/orders/parked/body?lane={head[1]}&id={head[0]}",
        "/s/orders/parked/confirm?key=k1&action=drop",
        "/s/orders/parked/bulk/confirm?action=redrive",
        "/s/orders/queues",
        "/s/orders/health",
        "/s/orders/audit",
        "/login",
        "/s/orders/lanes/99999",
        "/s/nope/overview",
    ]
    bodies = [operator.get(path, headers={"X-Relayer-CSRF": csrf}).text for path in paths]
    with operator.stream("GET", "/s/orders/events?view=parked&every=1") as stream:
        text = ""
        for chunk in stream.iter_text():
            text += chunk
            if "event: tick" in text:
                break
    bodies.append(text)
    assert "event: parked-summary" in text
    for body in bodies:
        assert SECRET not in body
        assert BROKER_SECRET not in body
    assert any("cannot reach amqp://guest:***@broker/" in body for body in bodies)


def test_bad_parameters_get_one_line_400(operator: TestClient) -> None:
    for path in (
        "/s/orders/lanes/99999",
        "/s/orders/parked?state=bogus",
        "/s/orders/parked?as_of=yesterday",
        "/s/orders/parked/body?lane=1&id=nope",
        "/s/orders/events?view=nope",
    ):
        response = operator.get(path)
        assert response.status_code == 400, path
        assert re.search(r'id="message">[^<\n]+</p>', response.text), path


def test_security_headers_on_every_response(read_only: TestClient) -> None:
    for path in ("/s/orders/overview", "/static/live.js", "/login"):
        response = read_only.get(path)
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        assert response.headers["x-frame-options"] == "DENY"
    page = read_only.get("/s/orders/overview").text
    assert not re.search(r"<script(?![^>]*\bsrc=)", page), "no inline script"
    assert " style=" not in page, "no inline style"


def audit_free_head(store: StoreSettings) -> tuple[Any, int]:
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(
            "SELECT head_id, lane FROM orders_parked WHERE ordering_key = 'k1'"
        ).fetchone()
    assert row is not None
    return row[0], int(row[1])


def test_a_store_that_cannot_be_reached_shows_the_error_without_its_password(
    pg_dsn: str,
) -> None:
    unreachable = make_store(f"postgresql://postgres:{SECRET}@127.0.0.1:1/nowhere", lanes=16)
    app = create_app([unreachable], Access([], read_only=True, allowed_hosts={HOST}), interval=1)
    with TestClient(app) as client:
        sampler = app.state.dashboard.contexts["orders"].sampler
        deadline = time.monotonic() + 10
        while sampler.error is None and time.monotonic() < deadline:
            time.sleep(0.05)
        page = client.get("/s/orders/overview")
    assert page.status_code == 200
    assert "cannot read the store" in page.text
    assert SECRET not in page.text
    del pg_dsn


async def test_apply_schema_creates_the_audit_table(pg_dsn: str) -> None:
    store = make_store(pg_dsn)
    await apply_schema(store)
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        assert await parked.has_audit_table(conn, store)


def test_members_show_the_lanes_their_share_owns_even_when_idle(store: StoreSettings) -> None:
    """Two live members of a 16-lane store own 8 lanes each by the heartbeat's ranking, though
    neither holds a lease yet (an idle worker renews no lane)."""
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        for member in ("member-a", "member-b"):
            conn.execute(
                f"INSERT INTO {store.table_prefix}leases (name, owner, token, expires_at) "
                "VALUES (%s, %s, gen_random_uuid(), now() + interval '1 hour')",
                (f"member:{member}", member),
            )
    for client in client_for(store, token=False):
        sampler = client.app.state.dashboard.contexts[store.name].sampler  # type: ignore[attr-defined]
        snapshot = sampler.snapshot
        assert snapshot is not None
        assert [(member.instance, member.owned, member.lanes) for member in snapshot.members] == [
            ("member-a", 8, 0),
            ("member-b", 8, 0),
        ]
        page = client.get("/s/orders/overview").text
        assert "Lanes owned" in page


async def test_the_fleet_page_lists_every_store_worst_first(pg_dsn: str) -> None:
    """With more than one store, / opens the fleet: one row per store as ``status --all``
    orders them, an unreachable store's error without its password."""
    orders = make_store(pg_dsn)
    billing = make_store(pg_dsn, name="billing", table_prefix="billing_")
    gone = make_store(f"postgresql://postgres:{SECRET}@127.0.0.1:1/x", name="gone")
    for settings in (orders, billing):
        await apply_schema(settings)
    park(billing, "stuck")
    access = Access([], read_only=True, allowed_hosts={HOST})
    app = create_app([orders, billing, gone], access, interval=1)
    with TestClient(app) as client:
        home = client.get("/", follow_redirects=False)
        page = client.get("/fleet")
        overview = client.get("/s/orders/overview")
    assert home.status_code == 303 and home.headers["location"] == "/fleet"
    assert page.status_code == 200
    rows = re.findall(r'<tr data-store="([^"]+)">', page.text)
    assert rows == ["gone", "billing", "orders"]
    assert "cannot be read" in page.text and SECRET not in page.text
    assert 'href="/fleet"' in overview.text  # every page links back to the fleet
