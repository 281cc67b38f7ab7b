"""What every subcommand shares: the parsed arguments and settings loaded on first use."""

from __future__ import annotations

import argparse
from functools import cached_property

from relayer.settings import RelayerSettings, StoreSettings, load_settings

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a Unix tool killed by a closed pipe reports


class Context:
    def __init__(self, arguments: argparse.Namespace) -> None:
        self.arguments = arguments

    @cached_property
    def settings(self) -> RelayerSettings:
        return load_settings(self.arguments.config)

    def store(self, name: str) -> StoreSettings:
        return self.settings.store(name)


def tcp_port(text: str) -> int:
    """An argparse type: a TCP port, 0-65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0-65535)")
    return port
