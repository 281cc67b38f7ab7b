"""examples/testing: an app's own test suite on relayer's pytest plugin, run as its README says."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.examples.documented import ROOT, documented

COMMAND = ".venv/bin/pytest examples/testing"


def test_the_example_suite_passes_as_documented(pg_server: str) -> None:
    documented(ROOT / "examples" / "testing" / "README.md", COMMAND)
    documented(ROOT / "docs" / "testing.md", COMMAND)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "examples/testing"],
        cwd=ROOT,
        env={**os.environ, "RELAYER_TEST_DSN": pg_server},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 passed" in result.stdout
