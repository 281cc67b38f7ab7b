"""An SVG of bench/soak.py's samples: rows sent a second, head read (median) and the store's size
over time, one line per mode and run. No dependency beyond the standard library.

    python bench/soak_plot.py SOAK.json PLOT.svg
"""

from __future__ import annotations

import json
import sys
from html import escape
from pathlib import Path
from typing import Any

PANELS = (
    ("sent_per_s", "rows sent per second"),
    ("read_ms_p50", "head read, median (ms)"),
    ("store_mb", "store size (MB)"),
)
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
WIDTH, PANEL_HEIGHT, LEFT, RIGHT, TOP, GAP = 760, 170, 70, 150, 30, 40


def label(number: float) -> str:
    return f"{number:,.0f}" if number >= 10 else f"{number:.2g}"


def panel(runs: list[dict[str, Any]], field: str, title: str, top: float, end: float) -> list[str]:
    """One panel: a frame, its title, the y axis from 0 to the largest value, a line a run."""
    width = WIDTH - LEFT - RIGHT
    highest = (
        max((sample[field] or 0 for run in runs for sample in run["samples"]), default=0) or 1.0
    )
    parts = [
        f'<rect x="{LEFT}" y="{top}" width="{width}" height="{PANEL_HEIGHT}" '
        'fill="none" stroke="#999"/>',
        f'<text x="{LEFT}" y="{top - 6}" font-size="13">{escape(title)}</text>',
        f'<text x="{LEFT - 6}" y="{top + 10}" font-size="11" text-anchor="end">'
        f"{label(highest)}</text>",
        f'<text x="{LEFT - 6}" y="{top + PANEL_HEIGHT}" font-size="11" text-anchor="end">0</text>',
    ]
    for index, run in enumerate(runs):
        points = " ".join(
            f"{LEFT + sample['minute'] / end * width:.1f},"
            f"{top + PANEL_HEIGHT - (sample[field] or 0) / highest * PANEL_HEIGHT:.1f}"
            for sample in run["samples"]
        )
        colour = COLOURS[index % len(COLOURS)]
        parts.append(
            f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
        )
    return parts


def legend(runs: list[dict[str, Any]]) -> list[str]:
    parts = []
    for index, run in enumerate(runs):
        y = TOP + 16 * index
        colour = COLOURS[index % len(COLOURS)]
        name = f"{run['mode']} ({run.get('kind', 'soak')})"
        parts.append(
            f'<line x1="{WIDTH - RIGHT + 12}" y1="{y}" x2="{WIDTH - RIGHT + 32}" y2="{y}" '
            f'stroke="{colour}" stroke-width="2"/>'
            f'<text x="{WIDTH - RIGHT + 36}" y="{y + 4}" font-size="11">{escape(name)}</text>'
        )
    return parts


def held_span(runs: list[dict[str, Any]], end: float, height: float) -> list[str]:
    """A grey band over the sample intervals in which the first run held its snapshot."""
    samples = runs[0]["samples"] if runs else []
    starts = [0.0, *(sample["minute"] for sample in samples)]
    held = [(starts[i], sample["minute"]) for i, sample in enumerate(samples) if sample.get("held")]
    if not held:
        return []
    width = WIDTH - LEFT - RIGHT
    first, last = held[0][0] / end * width + LEFT, held[-1][1] / end * width + LEFT
    return [
        f'<rect x="{first:.1f}" y="{TOP}" width="{max(last - first, 2):.1f}" '
        f'height="{height - TOP}" fill="#eee"/>'
    ]


def minute_ticks(end: float, y: float) -> list[str]:
    """Labels under the last panel: every minute, or every few when the run is long."""
    step = max(1, round(end / 10))
    width = WIDTH - LEFT - RIGHT
    return [
        f'<text x="{LEFT + minute / end * width:.1f}" y="{y}" font-size="11" '
        f'text-anchor="middle">{minute}</text>'
        for minute in range(0, int(end) + 1, step)
    ]


def render(results: dict[str, Any]) -> str:
    runs = [run for run in results.get("runs", []) if run.get("samples")]
    end = max((sample["minute"] for run in runs for sample in run["samples"]), default=1) or 1
    height = TOP + len(PANELS) * (PANEL_HEIGHT + GAP) + 30
    body = held_span(runs, end, TOP + 14 + len(PANELS) * (PANEL_HEIGHT + GAP) - GAP)
    for number, (field, title) in enumerate(PANELS):
        body += panel(runs, field, title, TOP + number * (PANEL_HEIGHT + GAP) + 14, end)
    body += legend(runs)
    body += minute_ticks(end, TOP + len(PANELS) * (PANEL_HEIGHT + GAP) - GAP + 28)
    body.append(
        f'<text x="{WIDTH - RIGHT}" y="{height - 4}" font-size="11" text-anchor="end">'
        "minutes; grey: the snapshot held</text>"
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'font-family="sans-serif">\n' + "\n".join(body) + "\n</svg>\n"
    )


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: python bench/soak_plot.py SOAK.json PLOT.svg")
    source, target = Path(sys.argv[1]), Path(sys.argv[2])
    try:
        results = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{source}: cannot read bench/soak.py's JSON: {exc}") from None
    target.write_text(render(results))


if __name__ == "__main__":
    main()
