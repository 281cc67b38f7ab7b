"""bench/efficiency.py in a short version, as CI runs every benchmark: it must print its table."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bench.efficiency_processes import Callgrind
from tests.acceptance.cli import environment

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "efficiency.py"


def figures(output: str, path: str) -> list[str]:
    """The cells of the table row whose path cell starts with ``path``."""
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith(path):
            return cells[1:]
    raise AssertionError(f"no table row for {path!r} in:\n{output}")


def postgres_is_local(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        comm = Path(f"/proc/{conn.info.backend_pid}/comm")
        return comm.exists() and comm.read_text().startswith("postgres")


def test_efficiency_prints_the_table_and_the_steady_figures(pg_dsn: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--dsn",
            pg_dsn,
            "--rows",
            "2000",
            "--transport",
            "memory",
            "--steady-seconds",
            "3",
            "--steady-rate",
            "200",
        ],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| path | msg/s | worker main thread µs/msg | worker other threads |" in output
    relay = figures(output, "relay -> memory")
    floor = figures(output, "least PostgreSQL work")
    for row in (relay, floor):
        rate, total = float(row[0].replace(",", "")), float(row[-1])
        assert rate > 0 and total > 0, row
    if postgres_is_local(pg_dsn):  # the worker's own sessions were found and measured
        assert float(relay[3]) > 0, relay
    assert re.search(r"- memory: [\d.]+ µs/msg .*relayer spends [\d.]+", output), output
    assert "| **total (worker + its sessions + broker)** |" in output
    assert re.search(r"commit-to-ack \([\d,]+ samples after the warm-up\): p50 [\d.]+ ms", output)
    assert re.search(
        r"work costs [\d.]+ µs of CPU back to back, [\d.]+ after a 1 ms sleep and [\d.]+ after",
        output,
    ), output


def test_efficiency_rejects_an_out_of_range_option() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--lanes", "70000"],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "argument --lanes: 70000 is out of range: must be 1 to 65536" in result.stderr


# A process that says it started, then keeps a core busy until it is killed.
BUSY = "print('ready', flush=True)\nwhile True: sum(range(1000))"


@pytest.fixture
def callgrind_tools() -> None:
    missing = Callgrind.missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"{', '.join(missing)} not installed (Debian's valgrind package)")
        pytest.skip(f"{', '.join(missing)} not installed")


@pytest.mark.usefixtures("callgrind_tools")
async def test_callgrind_counts_a_process_instructions_in_each_window(tmp_path: Path) -> None:
    counter = Callgrind(str(tmp_path), "busy")
    process = await asyncio.create_subprocess_exec(
        *counter.prefix(),
        sys.executable,
        "-c",
        BUSY,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        assert await asyncio.wait_for(process.stdout.readline(), 60) == b"ready\n"
        counts = []
        for _ in range(2):
            await counter.begin(process.pid)
            await asyncio.sleep(0.5)
            counts.append(await counter.end(process.pid))
        # A busy loop executes millions of instructions in half a second, even under valgrind;
        # each window counts from zero (not the total since the process started).
        assert all(count > 1_000_000 for count in counts), counts
        assert max(counts) < 10 * min(counts), counts
    finally:
        process.kill()
        await process.wait()


@pytest.mark.usefixtures("callgrind_tools")
async def test_callgrind_names_a_process_it_does_not_run(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "input()", stdin=asyncio.subprocess.PIPE
    )
    try:
        with pytest.raises(RuntimeError, match=rf"callgrind_control --zero {process.pid}"):
            await Callgrind(str(tmp_path), "x").begin(process.pid)
    finally:
        process.kill()
        await process.wait()
