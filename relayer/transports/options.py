"""Reading a transport's pass-through options: one error type, a few typed readers.

Options come from ``TransportSettings`` (TOML or environment variables), so numbers and
booleans may arrive as strings and lists as comma-separated text. Every reader raises
:class:`TransportOptionError` naming the option, the value and what it must be; the registry
prefixes the option with the store and transport it belongs to.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from relayer.errors import ConfigurationError, TransportError
from relayer.redact import MASK, is_secret_name, redact

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class TransportOptionError(ConfigurationError, TransportError):
    """A transport option is unknown, malformed or unsafe (a configuration error: exit 2)."""

    def __init__(self, option: str, value: object, rule: str) -> None:
        shown = MASK if is_secret_name(option) else value
        if isinstance(shown, str):
            shown = redact(shown)
        super().__init__(option, shown, rule)


class Options:
    """A read-once view of a transport's options that can report the ones nobody read."""

    __slots__ = ("_read", "_values")

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)
        self._read: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self._values

    def raw(self, name: str, default: Any = None) -> Any:
        self._read.add(name)
        return self._values.get(name, default)

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.raw(name, default)
        if value is None or isinstance(value, str):
            return value
        raise TransportOptionError(name, value, "must be a string")

    def flag(self, name: str, default: bool) -> bool:
        value = self.raw(name, default)
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise TransportOptionError(name, value, "must be true or false")

    def integer(self, name: str, default: int, *, low: int = 0, high: int | None = None) -> int:
        value = self.raw(name, default)
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise TransportOptionError(name, value, "must be a whole number") from None
        if isinstance(value, float) and value != number:
            raise TransportOptionError(name, value, "must be a whole number")
        if number < low or (high is not None and number > high):
            limit = f"from {low:,} to {high:,}" if high is not None else f"at least {low:,}"
            raise TransportOptionError(name, value, f"must be {limit}")
        return number

    def seconds(self, name: str, default: float) -> float:
        value = self.raw(name, default)
        if isinstance(value, timedelta):
            return value.total_seconds()
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TransportOptionError(name, value, "must be a number of seconds") from None
        if number <= 0:
            raise TransportOptionError(name, value, "must be greater than 0 seconds")
        return number

    def names(self, name: str) -> frozenset[str]:
        """A set of names given as a list or as comma-separated text."""
        value = self.raw(name, ())
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",")]
        elif isinstance(value, list | tuple | set | frozenset):
            items = [item.strip() if isinstance(item, str) else item for item in value]
        else:
            raise TransportOptionError(name, value, "must be a list of names")
        if not all(isinstance(item, str) for item in items):
            raise TransportOptionError(name, value, "must be a list of names (strings)")
        return frozenset(item for item in items if item)

    def unread(self) -> dict[str, Any]:
        """The options no reader asked for, in the order they were given."""
        return {name: value for name, value in self._values.items() if name not in self._read}

    def reject_unread(self, transport_type: str, known: str) -> None:
        """Refuse options this transport does not understand (typos must not pass silently)."""
        unknown = self.unread()
        if unknown:
            name = next(iter(unknown))
            raise TransportOptionError(
                name,
                unknown[name],
                f"is not an option of the {transport_type} transport (known options: {known})",
            )
