"""An example relayer transport: JSON lines appended to one file per destination."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from relayer.errors import ConfigurationError, TransportError
from relayer.transports import (
    MESSAGE_ID_HEADER,
    ORDERING_KEY_HEADER,
    DestinationError,
    OutgoingMessage,
    SendError,
)


class FileTransport:
    """Appends each message to ``<directory>/<destination>.jsonl``."""

    def __init__(self, name: str, directory: Path) -> None:
        self._name = name
        self._directory = directory
        self._files: dict[str, BinaryIO] = {}
        self._broken: str | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def pipelines_within_key(self) -> bool:
        # Writes happen in call order and the first failed write breaks every later one.
        return True

    async def start(self) -> None:
        try:
            self._directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TransportError(f"cannot create {self._directory}: {exc}") from exc

    async def ordered_by_key(self, destination: str) -> bool:
        self._path(destination, error=DestinationError)
        return True

    async def publish(self, message: OutgoingMessage) -> Awaitable[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            if self._broken is not None:
                raise SendError(f"an earlier write failed ({self._broken}); retry later")
            handle = self._open(message.destination)
            headers = {**message.headers, MESSAGE_ID_HEADER: message.id_text}
            if message.key is not None:
                headers[ORDERING_KEY_HEADER] = message.key
            line = {
                "id": message.id_text,
                "key": message.key,
                "headers": headers,
                "body": base64.b64encode(message.body).decode(),
            }
            handle.write(json.dumps(line).encode() + b"\n")
            handle.flush()
        except SendError as exc:
            future.set_exception(exc)
        except OSError as exc:
            self._broken = str(exc)
            future.set_exception(SendError(f"writing {message.destination!r} failed: {exc}"))
        else:
            future.set_result(None)
        return future

    async def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()

    def _open(self, destination: str) -> BinaryIO:
        handle = self._files.get(destination)
        if handle is None:
            handle = self._path(destination, error=SendError).open("ab")
            self._files[destination] = handle
        return handle

    def _path(self, destination: str, *, error: type[Exception]) -> Path:
        if not destination or os.sep in destination or destination.startswith("."):
            message = f"{destination!r} is not a plain file name; use letters, digits, '-', '_'"
            raise (
                error(message) if error is DestinationError else SendError(message, retryable=False)
            )
        return self._directory / f"{destination}.jsonl"


def create(name: str, options: Mapping[str, Any]) -> FileTransport:
    """The entry point: ``[stores.X.transports.NAME]`` with ``type = "file"``."""
    directory = options.get("directory")
    if not directory:
        raise ConfigurationError("directory", directory, "is required: where to write the files")
    return FileTransport(name, Path(str(directory)))
