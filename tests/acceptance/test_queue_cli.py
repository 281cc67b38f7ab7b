"""``relayer queue pause|resume|limit|status`` as a user runs it: a subprocess."""

import re
import subprocess

import psycopg
import pytest

from relayer.settings import StoreSettings
from tests.integration.dispatch.helpers import relayer_cli


def relayer(store: StoreSettings, *arguments: str) -> subprocess.CompletedProcess[str]:
    return relayer_cli(store, *arguments, check=False)


def table(stdout: str) -> dict[str, list[str]]:
    """The rows of ``queue status``, by queue, as lists of cells (columns are 2+ spaces apart)."""
    rows = [re.split(r"\s{2,}", line.strip()) for line in stdout.splitlines()[1:]]
    header, *body = rows
    assert header[:4] == ["QUEUE", "STATE", "LIMIT", "IN USE"]
    return {row[0]: row[1:] for row in body}


def events(store: StoreSettings) -> list[tuple[str, str, str, str | None, int | None]]:
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute(
            "SELECT queue, action, actor, reason, concurrency_limit FROM orders_queue_events "
            "ORDER BY id"
        ).fetchall()
    return [tuple(row) for row in rows]  # type: ignore[misc]


def test_pause_and_resume_are_persisted_with_who_and_why(store: StoreSettings) -> None:
    paused = relayer(store, "queue", "pause", "orders", "--reason", "deploy 42", "--by", "alice")
    assert paused.returncode == 0, paused.stderr
    assert "queue 'orders' paused by alice (reason: deploy 42)" in paused.stdout
    status = relayer(store, "queue", "status", "orders")
    assert status.returncode == 0, status.stderr
    state, limit, in_use, by, _, reason = table(status.stdout)["orders"]
    assert (state, limit, in_use, by, reason) == ("paused", "-", "-", "alice", "deploy 42")
    resumed = relayer(store, "queue", "resume", "orders")
    assert resumed.returncode == 0, resumed.stderr
    assert events(store)[0] == ("orders", "pause", "alice", "deploy 42", None)
    queue, action, actor, reason, _ = events(store)[1]
    assert (queue, action, reason) == ("orders", "resume", None)
    assert re.fullmatch(r"[^@]+@[^:]+:\d+", actor), actor  # user@host:pid by default


def test_pause_all_and_named_queues(store: StoreSettings) -> None:
    assert relayer(store, "queue", "pause", "orders", "--all", "--by", "ops").returncode == 0
    assert relayer(store, "queue", "pause", "orders", "--queue", "billing").returncode == 0
    rows = table(relayer(store, "queue", "status", "orders").stdout)
    assert rows["* (all queues)"][0] == "paused" and rows["* (all queues)"][3] == "ops"
    assert rows["billing"][0] == "paused"
    assert rows["orders"][0] == "paused (all)"
    resumed = relayer(store, "queue", "resume", "orders", "--all")
    assert resumed.returncode == 0
    assert "queue 'billing' stays paused by its own pause" in resumed.stdout
    assert [row[:2] for row in events(store)] == [
        ("*", "pause"),
        ("billing", "pause"),
        ("*", "resume"),
    ]


def test_limit_and_status(store: StoreSettings) -> None:
    limited = relayer(store, "queue", "limit", "orders", "3", "--by", "bob")
    assert limited.returncode == 0, limited.stderr
    assert "queue 'orders': at most 3 running at once (set by bob)" in limited.stdout
    rows = table(relayer(store, "queue", "status", "orders").stdout)
    assert rows["orders"][:3] == ["running", "3", "0"]
    cleared = relayer(store, "queue", "limit", "orders", "none")
    assert cleared.returncode == 0 and "no limit" in cleared.stdout
    assert [row[1:] for row in events(store)][-2:] == [
        ("limit", "bob", None, 3),
        ("limit", events(store)[-1][2], None, None),
    ]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("0", "0"),
        ("-1", "-1"),
        ("abc", "'abc'"),
        ("2.5", "'2.5'"),
        ("2147483648", "2147483648"),
        ("99999999999999999999", "99999999999999999999"),
    ],
)
def test_a_bad_limit_exits_2_with_one_line(store: StoreSettings, value: str, shown: str) -> None:
    result = relayer(store, "queue", "limit", "orders", value)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"relayer: error: limit: {shown} is invalid: must be an integer from 1 to "
        "2,147,483,647, or 'none' to remove the limit"
    ]
    assert events(store) == []


def test_a_store_without_the_queue_tables_is_refused(pg_dsn: str) -> None:
    from tests.conftest import make_store

    result = relayer(make_store(pg_dsn), "queue", "status", "orders")
    assert result.returncode == 2
    assert "run `relayer schema apply orders`" in result.stderr
