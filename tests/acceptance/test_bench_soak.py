"""bench/soak.py in a tiny version (seconds, a low rate): it starts its private PostgreSQL and the
worker, samples, writes its JSON and plot, and skips a storage mode the store refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.soak_plot import render
from tests.acceptance.cli import environment

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def test_a_tiny_soak_samples_and_writes_its_json_and_plot(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--modes", "delete,no-such-mode", "--rate", "200",
            "--minutes", "0.15", "--hold-minutes", "0.05", "--sample-seconds", "3",
            "--writers", "1", "--batch", "10", "--lock-sample",
            "--json", str(tmp_path / "soak.json"), "--plot", str(tmp_path / "soak.svg"),
        ],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no-such-mode: skipped: the store refuses storage = 'no-such-mode'" in result.stdout
    results = json.loads((tmp_path / "soak.json").read_text())
    [run] = results["runs"]
    assert run["mode"] == "delete" and run["kind"] == "soak"
    samples = run["samples"]
    assert len(samples) == 3  # 9 s, a sample every 3 s
    assert any(sample["held"] for sample in samples)  # seconds 3 to 6 of 9
    for sample in samples:
        assert sample["store_mb"] > 0 and sample["read_ms_max"] >= sample["read_ms_p50"] >= 0
        assert sample["lock_wait_ms"] is not None and sample["partitions"] == 0
    assert "head read" in result.stdout and "µs/msg" in result.stdout
    svg = (tmp_path / "soak.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<polyline") == 3  # a panel, one mode


def test_the_plot_of_two_modes_has_a_line_per_mode_in_each_panel() -> None:
    sample = {"minute": 1.0, "sent_per_s": 10.0, "read_ms_p50": 0.1, "store_mb": 2.0}
    runs = [
        {"mode": mode, "kind": "soak", "samples": [sample, {**sample, "minute": 2.0}]}
        for mode in ("delete", "partitioned")
    ]
    svg = render({"runs": runs})
    assert svg.count("<polyline") == 6 and "partitioned (soak)" in svg


def test_a_bad_option_is_one_line_and_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--rate", "0"],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--rate must be above 0" in result.stderr
