"""How the pages show numbers, durations, times and sizes (Jinja filters)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


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


FILTERS: dict[str, Any] = {
    "age": age,
    "when": when,
    "iso": iso,
    "size": size,
    "number": number,
    "percent": percent,
}
