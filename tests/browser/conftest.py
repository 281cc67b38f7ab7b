"""Real-browser tests of the dashboard: Debian's chromium driven by Playwright's Python package
(no ``playwright install``: the system browser through ``executable_path``).

Without chromium or Playwright these tests skip with the reason, except under CI, where they
fail. ``RELAYER_TEST_CHROMIUM`` names another browser binary. With ``RELAYER_TEST_SCREENSHOTS=DIR``
the tests write the documentation's screenshots (docs/images) to DIR.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.services import unavailable

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")


def chromium_path() -> str | None:
    configured = os.environ.get("RELAYER_TEST_CHROMIUM")
    if configured:
        return configured if Path(configured).exists() else None
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        unavailable("Playwright is not installed: pip install -e '.[dev]'")
        return
    path = chromium_path()
    if path is None:
        unavailable(
            "chromium is not installed (apt-get install chromium), or set RELAYER_TEST_CHROMIUM"
        )
        return
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=path, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield launched
        finally:
            await launched.close()


class Served:
    """A dashboard application served by uvicorn in the test's event loop: the port is bound
    first (the application's allowed hosts name it), then ``async with served.serving(app)``."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.hosts = {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}

    @contextlib.asynccontextmanager
    async def serving(self, app: Any) -> AsyncIterator[Served]:
        import uvicorn

        config = uvicorn.Config(
            app, log_level="warning", access_log=False, timeout_graceful_shutdown=1
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[self.sock]))
        try:
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.02)
            yield self
        finally:
            server.should_exit = True
            await task
            self.sock.close()


class Console:
    """Every console error, page error and CSP violation of a page."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))

    def _console(self, message: Any) -> None:
        if message.type in ("error", "warning"):
            where = message.location.get("url", "") if message.location else ""
            self.errors.append(f"console {message.type}: {message.text} ({where})")


def screenshot_dir() -> Path | None:
    target = os.environ.get("RELAYER_TEST_SCREENSHOTS")
    if not target:
        return None
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    return path


async def screenshot(page: Any, name: str) -> None:
    target = screenshot_dir()
    if target is not None:
        await page.screenshot(path=str(target / f"dashboard-{name}.png"), full_page=True)
