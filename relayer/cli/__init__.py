"""The ``relayer`` command: a thin layer over the library.

Exit status: 0 success; 2 bad configuration or usage (one line naming the field, the value and
the rule, or a store whose schema was never applied, saying what to run); 1 runtime failure.
Each subcommand module exposes ``register(subparsers)`` and sets ``handler`` on its parser; a
handler returns the exit status.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from relayer import __version__
from relayer.cli import (
    completion_command,
    dashboard_command,
    demo_command,
    dev_command,
    parked_command,
    partitions_command,
    queue_command,
    run_command,
    schema_command,
    status_command,
)
from relayer.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_RUNTIME,
    EXIT_USAGE,
    Context,
    resolve_environment,
)
from relayer.errors import (
    ConfigurationError,
    MissingPrivilegeError,
    RelayerError,
    SchemaNotAppliedError,
    UsageError,
)
from relayer.observability.logs import configure, scrub

COMMANDS = (
    schema_command,
    run_command,
    status_command,
    parked_command,
    queue_command,
    partitions_command,
    dashboard_command,
    demo_command,
    dev_command,
    completion_command,
)


class _Parser(argparse.ArgumentParser):
    """argparse with its refusals on one line (docs/cli.md): the error and where the usage is,
    without the usage block itself. Subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            EXIT_USAGE, f"{self.prog}: error: {message}; `{self.prog} --help` shows the usage\n"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="relayer",
        description="Transactional-outbox relay: PostgreSQL to brokers, in order per key.",
    )
    parser.add_argument("--version", action="version", version=f"relayer {__version__}")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML configuration file (default: $RELAYER_CONFIG, else ./relayer.toml if it exists)",
    )
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--log-format", choices=["text", "json"])
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    context = Context(arguments, parser)
    try:
        resolve_environment(arguments, os.environ)
        if getattr(arguments, "without_settings", False):  # `completion`: works unconfigured
            configure(arguments.log_level or "WARNING", arguments.log_format or "text")
        else:
            settings = context.settings
            configure(
                arguments.log_level or settings.log_level,
                arguments.log_format or settings.log_format,
            )
        status: int = asyncio.run(arguments.handler(context))
        return status
    except (ConfigurationError, UsageError, SchemaNotAppliedError, MissingPrivilegeError) as exc:
        print(f"relayer: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except RelayerError as exc:
        print(f"relayer: {_one_line(exc)}", file=sys.stderr)
        return EXIT_RUNTIME
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`relayer parked list | head`): stop quietly, as Unix
        # tools do, and keep the interpreter's final flush from reporting it again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _one_line(exc: Exception) -> str:
    """The error for stderr: secrets masked, and one line even when a driver's message (such
    as libpq's "is the server running" hint) spans several."""
    return re.sub(r"\s*\n\s*", "; ", scrub(str(exc)).strip())


def run() -> None:
    status = main()
    # The interpreter's last garbage collection of every module's objects takes about half a
    # second on a busy 2-core machine; frozen objects are left out of it, and a stopping
    # worker must be gone within lease_duration / 2 + 1 s.
    gc.freeze()
    sys.exit(status)
