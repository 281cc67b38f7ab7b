"""The dashboard's vendored assets match the hashes recorded beside them, and its pure parts
(lane bytes, tokens) behave as documented."""

from __future__ import annotations

import hashlib
import re
from importlib import resources

import pytest

from relayer.cli import main
from relayer.dashboard.lanes import EXACT_PENDING, PARKED, STALLED, lane_map, pending_byte
from relayer.dashboard.security import Access, parse_token
from relayer.errors import ConfigurationError

VENDOR = resources.files("relayer.dashboard") / "static" / "vendor"


def test_every_vendored_file_matches_its_recorded_sha256() -> None:
    table = (VENDOR / "LICENSES.md").read_text("utf-8")
    recorded = dict(
        re.findall(r"^\| (\S+) \| [^|]+ \| [^|]+ \| [^|]+ \| ([0-9a-f]{64}) \|$", table, re.M)
    )
    files = {entry.name for entry in VENDOR.iterdir() if entry.name != "LICENSES.md"}
    assert set(recorded) == files
    for name, digest in recorded.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name


def test_templates_carry_no_inline_script_or_style() -> None:
    templates = resources.files("relayer.dashboard") / "templates"
    for entry in templates.iterdir():
        text = entry.read_text("utf-8")
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), entry.name
        assert " style=" not in text, entry.name
        assert not re.search(r"<[^>]*\son[a-z]+=", text), f"{entry.name}: inline handler"


def test_lane_map_marks_stalled_lanes_and_counts_states() -> None:
    row = (
        0,
        [0, 2, 3],
        [1 << 5 | 4, 6 << 5, 1 << 5 | 9],
        [[1, 2], [6, 1]],
        ["worker-a"],
        ["0,3"],
        [[3, 40.0], [0, 3.0]],
    )
    lanes = lane_map(4, row, stalled=[3])
    assert lanes.states[3] == STALLED << 5 | 9 and lanes.states[2] >> 5 == PARKED
    assert lanes.counts == {
        "empty": 1,
        "flowing": 1,
        "waiting": 0,
        "unowned": 0,
        "stalled": 1,
        "retrying": 0,
        "parked": 1,
    }
    assert lanes.owner_bytes == bytes([1, 0, 0, 1])
    assert [(lane.lane, lane.state_name, lane.owner) for lane in lanes.oldest] == [
        (3, "stalled", "worker-a"),
        (0, "flowing", "worker-a"),
    ]


def test_pending_bytes_are_exact_to_128_then_logarithmic() -> None:
    assert [pending_byte(n) for n in (0, 1, EXACT_PENDING)] == [0, 1, EXACT_PENDING]
    assert pending_byte(256) == EXACT_PENDING + 8
    assert pending_byte(10**9) == 255


def test_tokens_are_named_checked_and_compared_whole() -> None:
    token = parse_token("--token", "alice:0123456789abcdef")
    assert token.name == "alice" and "0123" not in repr(token)
    assert parse_token("--token", "0123456789abcdef").name == "operator"
    with pytest.raises(ConfigurationError) as error:
        parse_token("--token", "short")
    assert "short" not in str(error.value)
    access = Access([token], read_only=False, allowed_hosts=())
    assert access.match("0123456789abcdef") is token
    assert access.match("0123456789abcdeX") is None
    assert Access([], read_only=False, allowed_hosts=()).read_only


def test_dashboard_refuses_a_short_token_at_start_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RELAYER_STORES__ORDERS__DSN", "postgresql://u:pw@127.0.0.1:1/db")
    monkeypatch.setenv("RELAYER_DASHBOARD_TOKEN", "tiny")
    assert main(["dashboard", "orders", "--port", "0"]) == 2
    error = capsys.readouterr().err
    assert "RELAYER_DASHBOARD_TOKEN" in error and "at least 16" in error and "tiny" not in error
