"""What every subcommand shares: the parsed arguments, settings loaded on first use, argument
types, and options that fall back to an environment variable."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import cached_property
from typing import Any

from pydantic import TypeAdapter, ValidationError

from relayer.errors import UsageError
from relayer.settings import Duration, RelayerSettings, StoreSettings, load_settings

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a Unix tool killed by a closed pipe reports


class Context:
    """What a subcommand gets: its parsed ``arguments``, the ``parser`` that parsed them (the
    whole command line's: ``completion`` describes it) and the settings, loaded on first use."""

    def __init__(
        self, arguments: argparse.Namespace, parser: argparse.ArgumentParser | None = None
    ) -> None:
        self.arguments = arguments
        self.parser = parser

    @cached_property
    def settings(self) -> RelayerSettings:
        return load_settings(self.arguments.config)

    def store(self, name: str) -> StoreSettings:
        """A configured store, or ``TEMPLATE.NAME``: a store a template's source lists now."""
        settings = self.settings
        template = name.partition(".")[0]
        if name not in settings.stores and "." in name and template in settings.templates:
            from relayer.fleet.sources import find_store

            return find_store(settings.template(template), name)
        return settings.store(name)


def tcp_port(text: str) -> int:
    """An argparse type: a TCP port, 0-65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0-65535)")
    return port


def template_names(text: str) -> tuple[str, ...]:
    """An argparse type: template names, separated by commas ('tenants' or 'tenants,partners';
    whether each is configured is checked with the settings)."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names no template (NAME or NAME,NAME)")
    return names


_DURATION: TypeAdapter[timedelta] = TypeAdapter(Duration)


def duration(text: str) -> timedelta:
    """An argparse type: a duration as the settings spell it ('30', '30s', '250ms', '5m',
    'PT30S')."""
    try:
        return _DURATION.validate_python(text)
    except ValidationError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (seconds, or a number with a unit: '250ms', '30s', "
            "'5m', '1h')"
        ) from None


def positive_seconds(text: str) -> float:
    """An argparse type: a duration > 0, in seconds."""
    seconds = duration(text).total_seconds()
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration > 0")
    return seconds


def count(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from {low} to {high}")
        return value

    parse.__name__ = f"count_{low}_{high}"
    return parse


@dataclass(frozen=True, slots=True)
class EnvironmentOption:
    """An option of one command that, when not given, comes from ``variable``, else
    ``default``."""

    dest: str
    flag: str
    variable: str
    parse: Callable[[str], Any]
    default: Any


def environment_option(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    variable: str,
    default: Any = None,
    parse: Callable[[str], Any] = str,
    help: str,
    **options: Any,
) -> None:
    """Add ``flag`` to ``parser``: the command line wins, then ``$variable``, then ``default``
    (an empty variable counts as unset). ``resolve_environment`` fills it in after parsing."""
    action = parser.add_argument(
        flag, type=parse, default=None, help=f"{help}; env {variable}", **options
    )
    known: tuple[EnvironmentOption, ...] = parser.get_default("environment_options") or ()
    option = EnvironmentOption(action.dest, flag, variable, parse, default)
    parser.set_defaults(environment_options=(*known, option))


def resolve_environment(arguments: argparse.Namespace, environ: Mapping[str, str]) -> None:
    """Fill each environment option not given on the command line; a value its flag would
    refuse is a UsageError naming the variable (exit 2)."""
    for option in getattr(arguments, "environment_options", ()):
        if getattr(arguments, option.dest) is not None:
            continue
        text = environ.get(option.variable, "")
        value = option.default
        if text.strip():
            try:
                value = option.parse(text)
            except (argparse.ArgumentTypeError, ValueError) as exc:
                raise UsageError(
                    f"{option.variable}: {exc} (it stands for {option.flag}); fix it or unset it"
                ) from None
        setattr(arguments, option.dest, value)
