"""`.ci/run` is what CI executes: a syntax error there fails every run before a test starts
(twice a Debian-package install was pasted into its header comment)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "run"


def test_the_ci_script_parses_and_ends_in_make_test() -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.fail("bash is needed to check .ci/run")
    checked = subprocess.run([bash, "-n", str(SCRIPT)], check=False, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    lines = [line for line in SCRIPT.read_text().splitlines() if line and not line.startswith("#")]
    assert lines[-1] == "make test"
    assert "set -euo pipefail" in lines
