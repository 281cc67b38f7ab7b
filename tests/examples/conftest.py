"""The examples are scripts run from their own folders; the tests import them the same way."""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
for folder in ("fastapi_sqlalchemy", "consumers"):
    if str(EXAMPLES / folder) not in sys.path:
        sys.path.insert(0, str(EXAMPLES / folder))
