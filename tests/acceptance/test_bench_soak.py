"""bench/soak.py in a tiny version (seconds, a low rate): it starts its private PostgreSQL and the
worker, samples, writes its JSON and plot, and skips a storage mode the store refuses."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from bench.soak import Schedule, find_max
from bench.soak_plot import render
from tests.acceptance.cli import environment

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "soak.py"


def test_a_tiny_soak_samples_and_writes_its_json_and_plot(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--modes", "delete,partitioned,no-such-mode",
            "--rate", "200", "--partition-span", "1m",
            "--minutes", "0.1", "--hold-minutes", "0.03", "--sample-seconds", "2",
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
    delete, partitioned = results["runs"]
    for run in (delete, partitioned):
        assert run["kind"] == "soak"
        samples = run["samples"]
        assert len(samples) == 3  # 6 s, a sample every 2 s
        # Held over 1.8 s in the middle: the intervals whose middle (1, 3, 5 s) is in 2.1-3.9 s.
        assert [sample["held"] for sample in samples] == [False, True, False]
        for sample in samples:
            assert sample["store_mb"] > 0 and sample["read_ms_max"] >= sample["read_ms_p50"] >= 0
            assert sample["lock_wait_ms"] is not None
            # The outbox's partitions: a minute's span, and the spans made ahead of the clock.
            assert (sample["partitions"] > 10) is (run is partitioned)
    assert (delete["mode"], partitioned["mode"]) == ("delete", "partitioned")
    assert "head read" in result.stdout and "µs/msg" in result.stdout
    svg = (tmp_path / "soak.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<polyline") == 6  # 3 panels, a line per mode


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


class FakeWriters:
    def __init__(self) -> None:
        self.rates: list[float] = []

    def set_rate(self, rate: float) -> None:
        self.rates.append(rate)

    def check(self) -> None:
        pass


class FakeSampler:
    """Each sample (10 s) at a rate: the writers write min(rate, writers_limit) a second; the
    relay sends at most relay_limit a second, and the backlog grows by the difference."""

    def __init__(self, relay_limit: float, writers_limit: float) -> None:
        self.monitor = SimpleNamespace(writers=FakeWriters())
        self.samples: list[SimpleNamespace] = []
        self.started = 0.0
        self.relay_limit, self.writers_limit = relay_limit, writers_limit
        self.backlog = 0.0

    async def begin(self) -> None:
        self.started = time.perf_counter()

    async def take(self, rate: float) -> SimpleNamespace:
        written = min(rate, self.writers_limit)
        self.backlog += max(0.0, written - self.relay_limit) * 10
        sample = SimpleNamespace(backlog=int(self.backlog), written_per_s=written)
        self.samples.append(sample)
        return sample


def find_max_of(relay_limit: float, writers_limit: float) -> tuple[float | None, bool, str]:
    arguments = argparse.Namespace(rate=1000.0, step_factor=2.0, step_samples=3)
    plan = Schedule(seconds=3600, sample=0, hold=None)
    sampler = FakeSampler(relay_limit, writers_limit)
    worker = SimpleNamespace(check=lambda: None)
    return asyncio.run(find_max(sampler, plan, worker, arguments))  # type: ignore[arg-type]


def test_find_max_stops_at_the_first_rate_the_relay_falls_behind_at() -> None:
    sustained, found, why = find_max_of(relay_limit=5000, writers_limit=1e9)
    assert (sustained, found) == (4000, True)  # 1,000, 2,000, 4,000 kept up; 8,000 did not
    assert "the backlog grew in two samples in a row at 8,000/s" in why


def test_find_max_says_when_the_writers_were_the_limit() -> None:
    sustained, found, why = find_max_of(relay_limit=1e9, writers_limit=3000)
    assert (sustained, found) == (2000, False)
    assert "the writers reached only 3,000 rows/s of 4,000; the relay kept up" in why
