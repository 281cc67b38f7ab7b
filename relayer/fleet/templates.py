"""Templates: the settings of many stores that a discovery source names.

A ``[templates.NAME]`` table holds every store setting (as a ``[stores.NAME]`` table does),
plus where its stores come from (``[templates.NAME.discovery]``: a file or a catalog query),
how often that source is read again, and the weight and concurrency limit its stores get by
default. Each row the source yields names one store and may set its ``dsn``, ``schema``,
``table_prefix``, ``weight`` and ``concurrency_limit``; everything else comes from the template.
The store is called ``TEMPLATE.NAME`` (``tenants.acme``) and is validated exactly like a
configured store: a row that breaks a rule is skipped with one line naming the store, the
field, the value and the rule (docs/fleet.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

import relayer.settings as _settings  # its functions are defined after it imports this module
from relayer.errors import ConfigurationError
from relayer.redact import redact
from relayer.settings import Count, Duration, StoreSettings

TEMPLATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,40}")
TEMPLATE_NAME_RULE = (
    "a template name is 1-41 characters: letters, digits, '_' or '-', starting with a letter or "
    "digit (its stores are named TEMPLATE.NAME, and a store name has at most 63 characters)"
)
ROW_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
ROW_NAME_RULE = (
    "a discovered store's name is letters, digits, '_', '.' or '-', starting with a letter or "
    "digit (the store is named TEMPLATE.NAME, at most 63 characters in all)"
)
# The queue table's integer column (relayer.dispatch.control.MAX_LIMIT).
MAX_CONCURRENCY_LIMIT = 2**31 - 1
MIN_DISCOVER_INTERVAL = timedelta(seconds=1)
MAX_DISCOVER_INTERVAL = timedelta(days=1)
FILE_FORMATS = (".toml", ".json")
# What a discovery row may set; the rest of a store's settings come from its template.
ROW_FIELDS = ("name", "dsn", "schema", "table_prefix", "weight", "concurrency_limit")
# Template settings that are not store settings.
_TEMPLATE_ONLY = ("discovery", "discover_interval", "weight", "concurrency_limit")


class DiscoverySettings(BaseModel):
    """Where a template's stores come from: ``file`` (TOML or JSON) or ``query`` (SQL run on
    the catalog database ``dsn``, by default the template's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: Path | None = None
    query: str | None = None
    dsn: str | None = Field(default=None, repr=False)

    @field_validator("dsn")
    @classmethod
    def _check_dsn(cls, value: str | None) -> str | None:
        return _settings.check_dsn(value)

    @field_validator("file")
    @classmethod
    def _check_file(cls, value: Path | None) -> Path | None:
        if value is not None and value.suffix.lower() not in FILE_FORMATS:
            raise ValueError(
                "must be a .toml file (an array of [[stores]] tables) or a .json file (an "
                "array of objects): the suffix says how to read it"
            )
        return value

    @field_validator("query")
    @classmethod
    def _check_query(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("is empty; give the SELECT that lists the stores")
        return value

    @model_validator(mode="after")
    def _check_source(self) -> DiscoverySettings:
        if (self.file is None) == (self.query is None):
            raise ValueError(
                "needs exactly one source: file = 'stores.toml' (or .json), or query = "
                "'SELECT name, ... FROM ...' on the catalog database"
            )
        if self.file is not None and self.dsn is not None:
            raise ValueError("dsn is the catalog database of a query; a file source takes none")
        return self

    def describe(self) -> str:
        """The source as log lines name it (never a secret)."""
        if self.file is not None:
            return f"file {self.file}"
        return "catalog query" + (f" on {redact(self.dsn)}" if self.dsn else "")


class TemplateSettings(StoreSettings):
    """Every store setting, the defaults of the stores a discovery source yields."""

    discovery: DiscoverySettings
    discover_interval: Duration = timedelta(seconds=30)
    weight: Count | None = None
    concurrency_limit: Count | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not TEMPLATE_NAME.fullmatch(value):
            raise ValueError(TEMPLATE_NAME_RULE)
        return value

    @field_validator("discover_interval")
    @classmethod
    def _check_discover_interval(cls, value: timedelta) -> timedelta:
        if not MIN_DISCOVER_INTERVAL <= value <= MAX_DISCOVER_INTERVAL:
            raise ValueError("must be from 1 second to 1 day")
        return value

    @field_validator("weight")
    @classmethod
    def _check_weight(cls, value: int | None) -> int | None:
        return _weight(value)

    @field_validator("concurrency_limit")
    @classmethod
    def _check_limit(cls, value: int | None) -> int | None:
        return _limit(value)

    def store_values(self) -> dict[str, Any]:
        """The settings its stores start from (by their TOML names), without the template's
        own (transports dump their options as extra fields: the table as configured)."""
        return self.model_dump(by_alias=True, exclude={"name", *_TEMPLATE_ONLY})

    def catalog_dsn(self) -> str | None:
        """Where a query source runs: ``discovery.dsn``, else the template's dsn."""
        return self.discovery.dsn or self.dsn


@dataclass(frozen=True, slots=True)
class DiscoveredRow:
    """One row of a discovery source, as read: only ``name`` is required."""

    name: object
    dsn: object = None
    schema: object = None
    table_prefix: object = None
    weight: object = None
    concurrency_limit: object = None
    where: str = ""  # "row 3", for messages

    def __repr__(self) -> str:  # a DSN may hold a password
        return f"DiscoveredRow({self.name!r}, {self.where})"


@dataclass(frozen=True, slots=True)
class DiscoveredStore:
    """A store a template's source yields, validated like a configured one."""

    settings: StoreSettings
    weight: int | None  # the row's, else the template's (None: worker.weights, else 1)
    concurrency_limit: int | None  # the row's, else the template's (None: left as it is)

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def where(self) -> tuple[str | None, str, str]:
        """The tables it uses: distinct stores must not share them."""
        return (self.settings.dsn, self.settings.db_schema, self.settings.table_prefix)


def row_from_mapping(values: Mapping[str, Any], where: str) -> DiscoveredRow:
    """A row from a file's table or a query's columns; an unknown field is a
    ConfigurationError naming it (the row is skipped)."""
    unknown = [str(key) for key in values if key not in ROW_FIELDS]
    if unknown:
        raise ConfigurationError(
            f"{where}.{unknown[0]}",
            values[unknown[0]] if "dsn" not in unknown[0] else "***",
            f"is not a field a discovery row may set (fields: {', '.join(ROW_FIELDS)}); the "
            "template sets everything else",
        )
    return DiscoveredRow(**{key: values[key] for key in values}, where=where)


def store_from_row(template: TemplateSettings, row: DiscoveredRow) -> DiscoveredStore:
    """Validate one row as a store of ``template`` (ConfigurationError naming the store's
    field, the value and the rule)."""
    if not isinstance(row.name, str) or not ROW_NAME.fullmatch(row.name):
        field = f"templates.{template.name}.{row.where}.name"
        raise ConfigurationError(field, row.name, ROW_NAME_RULE)
    name = f"{template.name}.{row.name}"
    prefix = f"stores.{name}"
    values = template.store_values()
    values["name"] = name
    for field in ("dsn", "schema", "table_prefix"):
        value = getattr(row, field)
        if value is not None:
            values[field] = value
    if values.get("dsn") is None:
        raise ConfigurationError(
            f"{prefix}.dsn",
            None,
            f"is required to connect: give the row a dsn or set templates.{template.name}.dsn "
            "(or the top-level dsn)",
        )
    try:
        settings = StoreSettings.model_validate(values)
    except ValidationError as exc:
        raise _settings.configuration_error_from(exc, prefix=prefix) from None
    weight = _number(row.weight, _weight, f"{prefix}.weight")
    limit = _number(row.concurrency_limit, _limit, f"{prefix}.concurrency_limit")
    return DiscoveredStore(
        settings,
        weight if weight is not None else template.weight,
        limit if limit is not None else template.concurrency_limit,
    )


def _whole(value: object) -> int | None:
    """A row's number as an int: SQL numeric and float columns that hold a whole number too."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("must be a whole number, not true or false")
    if isinstance(value, int):
        return value
    try:
        number = float(value)  # type: ignore[arg-type]  # Decimal, float, numeric strings
    except (TypeError, ValueError):
        raise ValueError("must be a whole number") from None
    if not number.is_integer():
        raise ValueError("must be a whole number")
    return int(number)


def _number(value: object, check: Callable[[int | None], int | None], field: str) -> int | None:
    try:
        return check(_whole(value))
    except ValueError as exc:
        raise ConfigurationError(field, value, str(exc)) from None


def _weight(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise ValueError("must be a whole number >= 1 (the store's share of the worker's slots)")
    return value


def _limit(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= MAX_CONCURRENCY_LIMIT:
        raise ValueError(
            f"must be a whole number from 1 to {MAX_CONCURRENCY_LIMIT:,} (batches of the store "
            "running at once across the cluster), or left out to keep the store's own limit"
        )
    return value
