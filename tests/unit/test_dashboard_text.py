"""How the dashboard words what it shows (relayer.dashboard.format): long errors cut at a word,
and what a high share of dead rows means."""

from __future__ import annotations

from relayer.dashboard.format import clip, dead_note
from relayer.store.maintenance import TableHealth

ERROR = "broker refused the message: the schema registry rejected the payload for version 7"


def test_a_short_text_is_shown_whole() -> None:
    assert clip(ERROR, 200) == ERROR


def test_a_long_text_is_cut_after_its_last_whole_word() -> None:
    shown = clip(ERROR, 40)
    assert shown.endswith("…") and len(shown) <= 41
    kept = shown[:-1]
    assert ERROR.startswith(kept) and ERROR[len(kept)] in " :", shown


def test_a_word_longer_than_half_the_limit_is_cut_at_the_limit() -> None:
    word = "x" * 100
    assert clip(f"a {word}", 40) == ("a " + word)[:40] + "…"


def table(live: int, dead: int) -> TableHealth:
    return TableHealth("orders_outbox", live, dead, None, 8192)


def test_a_high_share_of_few_dead_rows_is_explained() -> None:
    note = dead_note(table(2, 98))
    assert "only 98 dead rows" in note and "10,000" in note


def test_a_bloated_table_points_at_its_warning() -> None:
    assert "autovacuum is behind" in dead_note(table(1_000, 50_000))


def test_a_low_share_needs_no_note() -> None:
    assert dead_note(table(1_000, 10)) == ""
