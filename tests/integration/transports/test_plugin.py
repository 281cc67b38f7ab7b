"""A plug-in transport installed as a package is found through its entry point."""

from __future__ import annotations

import base64
import importlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from relayer.settings import TransportSettings
from relayer.transports.base import MESSAGE_ID_HEADER, OutgoingMessage
from relayer.transports.registry import create_transport, known_types

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "plugin_transport"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The example installed into a throw-away directory put on sys.path (the venv stays),
    with the command its README gives (plus the target)."""
    assert "`pip install ./examples/plugin_transport`" in (EXAMPLE / "README.md").read_text()
    target = tmp_path_factory.mktemp("plugin")
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
               str(target), str(EXAMPLE)]  # fmt: skip
    # Without build isolation when the venv can build wheels (offline); else pip fetches
    # setuptools for the build, as any source install does.
    built = subprocess.run([*command, "--no-build-isolation"], capture_output=True, check=False)
    if built.returncode != 0:
        built = subprocess.run(command, capture_output=True, text=True, check=False)
        assert built.returncode == 0, f"pip could not install the example plug-in: {built.stderr}"
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    try:
        yield target
    finally:
        sys.path.remove(str(target))
        sys.modules.pop("relayer_file_transport", None)


async def test_the_example_plugin_is_used_through_the_registry(
    installed: Path, tmp_path: Path
) -> None:
    assert "file" in known_types()
    settings = TransportSettings(type="file", directory=str(tmp_path))
    transport = create_transport("orders", "audit", settings)
    await transport.start()
    assert await transport.ordered_by_key("events") is True
    sent = OutgoingMessage(uuid.uuid4(), "events", b"\xff\x00", key="k", headers={"a": "b"})
    await (await transport.publish(sent))
    await transport.close()

    line = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[0])
    assert base64.b64decode(line["body"]) == b"\xff\x00"
    assert line["headers"] == {
        "a": "b",
        MESSAGE_ID_HEADER: str(sent.id),
        "relayer-ordering-key": "k",
    }
