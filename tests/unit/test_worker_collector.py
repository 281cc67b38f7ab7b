"""A worker process started by ``relayer run`` tunes its garbage collector (never the library)."""

from __future__ import annotations

import gc
import subprocess
import sys

from relayer.cli.run_command import GC_THRESHOLDS, _tune_collector


def test_the_worker_process_collects_less_often_and_freezes_its_start_up() -> None:
    before = gc.get_threshold()
    try:
        _tune_collector()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_importing_the_library_leaves_the_collector_alone() -> None:
    """An application that embeds a Worker keeps its own collector settings."""
    script = "import gc; before = gc.get_threshold(); import relayer.worker; " + (
        "print(gc.get_threshold() == before, gc.get_freeze_count())"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["True", "0"]
