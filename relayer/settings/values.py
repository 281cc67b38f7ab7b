"""The value types every settings model is built from, and the checks they share.

``Duration`` takes seconds, a number with a unit or ISO 8601; ``OptionalDuration`` also takes
``"off"``; ``Count`` refuses booleans. A rule that ties several fields together is raised from a
model validator as :class:`RelationError`, which
:func:`~relayer.settings.loading.configuration_error_from` turns into one line naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator

from relayer.pooler import dsn_parse_error

_DURATION = re.compile(r"\s*(?P<number>-?\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m|h|d)?\s*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RULE = (
    "must be a duration: seconds as a number, a number with a unit ('250ms', '30s', '5m', '1h', "
    "'7d') or ISO 8601 ('PT30S')"
)


def _parse_duration(value: object) -> object:
    """Accept seconds as a number, ``"250ms"``/``"30s"``/``"5m"``/``"1h"``/``"7d"``, or ISO 8601
    (not a boolean, which pydantic would read as 0 or 1 second)."""
    if isinstance(value, bool):
        raise ValueError(f"{_DURATION_RULE}, not true or false")
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match:
            unit = match.group("unit") or "s"
            return timedelta(seconds=float(match.group("number")) * _UNIT_SECONDS[unit])
        if not value.strip().lstrip("-").startswith("P"):
            raise ValueError(_DURATION_RULE)
    return value


Duration = Annotated[timedelta, BeforeValidator(_parse_duration)]


def _refuse_booleans(value: object) -> object:
    """``lanes = true`` must not become 1: booleans are not counts."""
    if isinstance(value, bool):
        raise ValueError("must be a whole number, not true or false")
    return value


Count = Annotated[int, BeforeValidator(_refuse_booleans)]

_OFF = ("off", "none", "never")


def _parse_optional_duration(value: object) -> object:
    """A duration, or ``"off"`` (also ``"none"``, ``"never"`` or None) for a disabled feature."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _OFF):
        return None
    return _parse_duration(value)


OptionalDuration = Annotated[timedelta | None, BeforeValidator(_parse_optional_duration)]


class RelationError(ValueError):
    """A rule that ties several fields together, raised from a model validator."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        super().__init__(rule)
        self.field = field
        self.value = value
        self.rule = rule


_QUOTED = re.compile(r'"[^"]*"')


def check_dsn(value: str | None) -> str | None:
    """A DSN libpq can parse (a ``postgresql://`` URL or key=value pairs), or None.

    The reason libpq gives quotes pieces of the DSN, which may be pieces of a password, so
    they are left out of the error.
    """
    if not value:
        return value
    error = dsn_parse_error(value)  # libpq is the authority on what parses
    if error is not None:
        reason = _QUOTED.sub(_elide_quoted, error.strip().splitlines()[0] if error else "")
        raise ValueError(
            f"is not a PostgreSQL connection string ({reason}); use a postgresql:// URL "
            "(percent-encode spaces as %20) or key=value pairs, putting a value that contains "
            "spaces in single quotes"
        )
    return value


def _elide_quoted(match: re.Match[str]) -> str:
    return match[0] if match[0] == '"="' else '"..."'


def listed_names(mapping: Mapping[str, object]) -> str:
    """The keys of ``mapping`` for a message: ``'a', 'b'``, or ``none``."""
    return ", ".join(repr(name) for name in mapping) or "none"
