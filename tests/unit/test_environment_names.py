"""Every RELAYER_ variable relayer itself reads is one the start-up check accepts."""

from __future__ import annotations

import re
from pathlib import Path

from relayer.environment import NOT_SETTINGS, RESERVED_PREFIXES

PACKAGE = Path(__file__).resolve().parents[2] / "relayer"


def test_every_variable_relayer_reads_is_accepted() -> None:
    read = {
        name
        for path in PACKAGE.rglob("*.py")
        for name in re.findall(r"\"(RELAYER_[A-Z_]+)\"", path.read_text())
    }
    refused = {
        name
        for name in read
        if name not in NOT_SETTINGS
        and not name.startswith(RESERVED_PREFIXES)
        and name != "RELAYER_"
    }
    assert refused == set()
