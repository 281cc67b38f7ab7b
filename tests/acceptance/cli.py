"""Running ``relayer`` as a user does: a subprocess configured through the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping

from relayer.settings import StoreSettings


def environment(store: StoreSettings | None = None, **extra: str) -> dict[str, str]:
    """This process's environment without RELAYER_ settings, plus ``store`` and ``extra``."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("RELAYER_") or key.startswith("RELAYER_TEST_")
    }
    if store is not None:
        prefix = f"RELAYER_STORES__{store.name.upper()}__"
        env[prefix + "DSN"] = store.require_dsn()
        env[prefix + "SCHEMA"] = store.db_schema
        env[prefix + "TABLE_PREFIX"] = store.table_prefix
        env[prefix + "LANES"] = str(store.lanes)
    env.update(extra)
    return env


def command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "relayer", *arguments]


def relayer(
    *arguments: str,
    store: StoreSettings | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``relayer ARGUMENTS`` to completion and capture its output."""
    return subprocess.run(
        command(*arguments),
        env=dict(env) if env is not None else environment(store),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
