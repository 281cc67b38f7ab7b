"""Running what a document tells a reader to run: its code blocks and its commands.

A test takes the code out of the Markdown (so an edit to the document is what gets tested) or
checks that the command it runs is written in the document word for word.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A fenced block, at the start of a line or indented as one in a list item.
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.MULTILINE | re.DOTALL)


def code_block(document: Path, language: str, containing: str) -> str:
    """The one ``language`` block of ``document`` that contains ``containing`` (dedented)."""
    blocks = [
        textwrap.dedent(body)
        for _, found, body in _FENCE.findall(document.read_text())
        if found == language and containing in body
    ]
    assert len(blocks) == 1, f"{document}: {len(blocks)} {language} blocks with {containing!r}"
    return blocks[0]


def documented(document: Path, *commands: str) -> None:
    """Assert that ``document`` tells the reader to run each command exactly as written."""
    text = document.read_text()
    for command in commands:
        assert command in text, f"{document.name} no longer says {command!r}"


def environment(**extra: str) -> dict[str, str]:
    """A user's shell: this environment without relayer settings, the project's venv first."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RELAYER_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run(
    command: list[str], *, cwd: Path, env: Mapping[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command,
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stderr}"
    return result


@contextlib.contextmanager
def running(
    command: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    output: list[str],
    exits: tuple[int, ...] = (0,),
) -> Iterator[subprocess.Popen[str]]:
    """A background process, stopped with SIGTERM (as ``kill`` or Kubernetes would) on exit.

    Its output (stdout and stderr together) is appended to ``output`` once it has exited; a
    process whose exit status after SIGTERM is not one of ``exits`` fails the test.
    """
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            text, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            text, _ = process.communicate()
        output.append(text)
    assert process.returncode in exits, f"{command} exited {process.returncode}:\n{text}"


def wait_until(condition: Callable[[], bool], what: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"still waiting after {within:g} s for {what}"
        time.sleep(0.1)
