"""How the pages show numbers, durations, times and sizes (Jinja filters)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from relayer.store.maintenance import DEAD_RATIO_WARNING, DEAD_ROWS_WARNING, TableHealth


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172_800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def iso(moment: datetime | None) -> str:
    return "" if moment is None else moment.isoformat()


def size(value: int | None) -> str:
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "kB", "MB", "GB"):
        if amount < 1024 or unit == "GB":
            return f"{amount:,.0f} {unit}" if unit == "B" else f"{amount:,.1f} {unit}"
        amount /= 1024
    return f"{amount:,.1f} GB"


def number(value: int | float | None) -> str:
    return "-" if value is None else f"{value:,}"


def percent(value: float) -> str:
    return f"{value:.0%}"


def clip(text: str, limit: int = 160) -> str:
    """``text`` if it has at most ``limit`` characters, else its start cut after the last
    whole word that fits (a word longer than half of ``limit`` is cut) and an ellipsis."""
    if len(text) <= limit:
        return text
    head = text[: limit + 1]
    space = max(head.rfind(" "), head.rfind("\n"))
    head = head[:space] if space >= limit // 2 else text[:limit]
    return head.rstrip(" ,;:.(\n") + "…"


def dead_note(table: TableHealth) -> str:
    """What the share of dead rows beside it means, when it is high."""
    if table.bloated:
        return "autovacuum is behind: see the warning above"
    if table.dead_ratio >= DEAD_RATIO_WARNING and table.dead_rows:
        return (
            f"only {table.dead_rows:,} dead rows: usual for an outbox between two vacuums "
            f"(rows are inserted and deleted all day); a warning comes from "
            f"{DEAD_ROWS_WARNING:,} dead rows"
        )
    return ""


FILTERS: dict[str, Any] = {
    "age": age,
    "when": when,
    "iso": iso,
    "size": size,
    "number": number,
    "percent": percent,
    "clip": clip,
    "dead_note": dead_note,
}
