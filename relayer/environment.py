"""The ``RELAYER_`` environment variables, checked before the settings are built.

pydantic-settings reads only the variables that match a setting, so a misspelled one
(``RELAYER_LOG_LEVL``, ``RELAYER_STORES_ORDERS_LANES`` with single underscores) would be ignored
without a word, and a whole section given as plain text (``RELAYER_WORKER=abc``) ends in a
parsing error that names neither the variable nor what to write instead. Every ``RELAYER_``
variable is walked along the settings' fields here: one that names no setting is refused with a
suggestion, one that sets a whole section must be a JSON object.

``RELAYER_CONFIG`` names the TOML file, ``RELAYER_DASHBOARD_TOKEN`` the dashboard's token,
``RELAYER_SUPERVISOR_PID`` a worker process's parent and ``RUN_OPTIONS`` the options of
``relayer run``; ``RELAYER_TEST_*`` and ``RELAYER_BENCH_*`` belong to relayer's own test suite
and benchmarks and are not settings.
"""

from __future__ import annotations

import difflib
import json
import re
import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

from relayer.errors import ConfigurationError
from relayer.redact import MASK, is_secret_name, redact

PREFIX = "RELAYER_"
DELIMITER = "__"
# Read by commands themselves, not settings: the TOML file, the dashboard's token, the parent's
# pid that `relayer run --processes` gives its children, and each option of `relayer run`
# (docs/cli.md#run: the option given on the command line wins).
RUN_OPTIONS = (
    "RELAYER_INSTANCE_ID",
    "RELAYER_TEMPLATE",
    "RELAYER_PROCESSES",
    "RELAYER_METRICS_PORT",
    "RELAYER_METRICS_HOST",
    "RELAYER_METRICS_INTERVAL",
    "RELAYER_METRICS_TOP_LANES",
)
NOT_SETTINGS = (
    "RELAYER_CONFIG",
    "RELAYER_DASHBOARD_TOKEN",
    "RELAYER_SUPERVISOR_PID",
    *RUN_OPTIONS,
)
RESERVED_PREFIXES = ("RELAYER_TEST_", "RELAYER_BENCH_")
_PAIR = re.compile(r"\s*(?P<name>[A-Za-z0-9_.-]+)\s*=\s*(?P<value>[^=]*?)\s*")


def check_environment(environ: Mapping[str, str], model: type[BaseModel]) -> None:
    """Refuse any ``RELAYER_`` variable in ``environ`` that ``model`` would not read, or would
    fail to parse, with a ConfigurationError naming the variable, its value and the fix."""
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(PREFIX) or upper in NOT_SETTINGS:
            continue
        if upper.startswith(RESERVED_PREFIXES):
            continue
        path = upper.removeprefix(PREFIX).lower().split(DELIMITER)
        _check(variable, environ[variable], path, model)


def _check(variable: str, value: str, path: list[str], model: type[BaseModel]) -> None:
    current: Any = model
    for depth, segment in enumerate(path):
        if _is_model(current):
            if current.model_config.get("extra") == "allow":
                return  # a transport's options: the transport checks them
            field = _field(current, segment)
            if field is None:
                if depth == 0:
                    raise ConfigurationError(
                        variable, _shown(path, value), _unknown_rule(path, model)
                    )
                return  # pydantic names it with its place in the settings
            current = _plain(_annotation(current, field))
        elif _is_mapping(current):
            current = _plain(get_args(current)[1])
        else:
            section = DELIMITER.join(path[:depth]).upper()
            raise ConfigurationError(
                variable,
                _shown(path, value),
                f"{PREFIX}{section} is a single value, not a section; set {PREFIX}{section} itself",
            )
    if (_is_model(current) or _is_mapping(current)) and not _is_json_object(value):
        raise ConfigurationError(
            variable, _shown(path, value), _section_rule(variable, value, current, path[-1])
        )


def _section_rule(variable: str, value: str, section: Any, name: str) -> str:
    pair = _PAIR.fullmatch(value)
    if pair and _is_mapping(section):
        example = f"{variable}{DELIMITER}{pair['name'].upper()}={pair['value']}"
    else:
        example = f"{variable}{DELIMITER}{_example(section, name)}"
    return (
        "sets a whole section, so it must be a JSON object; set one value per variable "
        f"instead, e.g. {example}"
    )


def _example(section: Any, name: str) -> str:
    """``NAME=value`` for one setting of ``section`` (the setting ``name``), for a message."""
    if _is_mapping(section):
        inner = _plain(get_args(section)[1])
        if _is_model(inner):
            return f"{_placeholder(name)}{DELIMITER}{_example(inner, '')}"
        return f"{_placeholder(name)}=..."
    for setting, field in section.model_fields.items():
        if setting == "name":
            continue
        shown = field.alias or setting
        default = field.default
        plain = default if isinstance(default, str | int) and not isinstance(default, bool) else ""
        return f"{shown.upper()}={plain or '...'}"
    return "<NAME>=..."


def _unknown_rule(path: list[str], model: type[BaseModel]) -> str:
    rule = "is not a setting relayer knows"
    command_option = difflib.get_close_matches(_variable(path), NOT_SETTINGS, n=1, cutoff=0.85)
    suggestion = command_option[0] if command_option else _suggest(path, model)
    if suggestion:
        return f"{rule}; did you mean {suggestion}?"
    known = ", ".join(
        PREFIX + (name.upper() if not _is_complex(model, name) else f"{name.upper()}__...")
        for name in model.model_fields
    )
    return (
        f"{rule} (settings: {known}, RELAYER_CONFIG and the options of `relayer run`, such as "
        "RELAYER_METRICS_PORT); fix its name or unset it"
    )


def _suggest(path: list[str], model: type[BaseModel]) -> str | None:
    top, rest = path[0], path[1:]
    names = list(model.model_fields)
    for name in names:
        section = _plain(_annotation(model, name))
        if not top.startswith(name + "_") and not (
            top.startswith(name.rstrip("s") + "_") and _is_mapping(section)
        ):
            continue
        remainder = top.split("_", 1)[1]
        if _is_mapping(section):
            # stores_orders_lanes: a store name, then one of its settings.
            inner = _plain(get_args(section)[1])
            if _is_model(inner):
                for field in sorted(_field_names(inner), key=len, reverse=True):
                    if remainder.endswith("_" + field):
                        key = remainder.removesuffix("_" + field)
                        return _variable([name, key, field, *rest])
            return _variable([name, _placeholder(name), "<setting>"])
        if _is_model(section) and _field(section, remainder) is not None:
            return _variable([name, remainder, *rest])
    close = difflib.get_close_matches(top, names, n=1, cutoff=0.6)
    if close:
        return _variable([close[0], *rest])
    for name in names:
        section = _plain(_annotation(model, name))
        inner = _plain(get_args(section)[1]) if _is_mapping(section) else section
        if _is_model(inner) and _field(inner, top) is not None:
            where = [name, _placeholder(name)] if _is_mapping(section) else [name]
            return f"{_variable([*where, top, *rest])} (a setting of the [{name}] section)"
    return None


def _placeholder(section: str) -> str:
    """``<STORE>`` for a key of ``stores`` (or of ``weights``), ``<TRANSPORT>``..."""
    noun = "store" if section.lower() in ("stores", "weights") else section.lower().rstrip("s")
    return f"<{noun.upper() or 'NAME'}>"


def _variable(path: list[str]) -> str:
    return PREFIX + DELIMITER.join(part.upper() for part in path)


def _shown(path: list[str], value: str) -> str:
    """The value, fit for an error: masked where it may hold a DSN or a secret."""
    if path[0] in ("stores", "templates") or any(
        part.endswith("dsn") or is_secret_name(part) for part in path
    ):
        return MASK
    if difflib.get_close_matches(path[0], ["dsn"], n=1, cutoff=0.6):
        return MASK
    return redact(value)


def _is_json_object(value: str) -> bool:
    try:
        return isinstance(json.loads(value), dict)
    except ValueError:
        return False


def _field(model: type[BaseModel], segment: str) -> str | None:
    for name, field in model.model_fields.items():
        if segment in (name, field.alias):
            return name
    return None


def _field_names(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def _annotation(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].annotation


def _is_complex(model: type[BaseModel], name: str) -> bool:
    section = _plain(_annotation(model, name))
    return _is_model(section) or _is_mapping(section)


def _plain(annotation: Any) -> Any:
    """``X`` for ``X | None``."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [member for member in get_args(annotation) if member is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _is_mapping(annotation: Any) -> bool:
    return get_origin(annotation) is dict
