"""Template settings (``[templates.NAME]``): every store setting, plus where the template's
stores come from (``[templates.NAME.discovery]``: a file or a catalog query), how often that
source is read again, and the weight and concurrency limit its stores get by default.

Turning a discovered row into a store's settings is relayer.fleet.templates' work; this module
holds what is configured (docs/fleet.md).
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from relayer.redact import redact
from relayer.settings.stores import StoreSettings
from relayer.settings.values import Count, Duration, check_dsn

TEMPLATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,40}")
TEMPLATE_NAME_RULE = (
    "a template name is 1-41 characters: letters, digits, '_' or '-', starting with a letter or "
    "digit (its stores are named TEMPLATE.NAME, and a store name has at most 63 characters)"
)
# The queue table's integer column (relayer.dispatch.control.MAX_LIMIT).
MAX_CONCURRENCY_LIMIT = 2**31 - 1
MIN_DISCOVER_INTERVAL = timedelta(seconds=1)
MAX_DISCOVER_INTERVAL = timedelta(days=1)
FILE_FORMATS = (".toml", ".json")
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
        return check_dsn(value)

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
        return check_weight(value)

    @field_validator("concurrency_limit")
    @classmethod
    def _check_limit(cls, value: int | None) -> int | None:
        return check_concurrency_limit(value)

    def store_values(self) -> dict[str, Any]:
        """The settings its stores start from (by their TOML names), without the template's
        own (transports dump their options as extra fields: the table as configured)."""
        return self.model_dump(by_alias=True, exclude={"name", *_TEMPLATE_ONLY})

    def catalog_dsn(self) -> str | None:
        """Where a query source runs: ``discovery.dsn``, else the template's dsn."""
        return self.discovery.dsn or self.dsn


def check_weight(value: int | None) -> int | None:
    """A template's or a discovered store's weight: None (the default) or at least 1."""
    if value is not None and value < 1:
        raise ValueError("must be a whole number >= 1 (the store's share of the worker's slots)")
    return value


def check_concurrency_limit(value: int | None) -> int | None:
    """A template's or a discovered store's concurrency limit: None, or what the queue table
    holds."""
    if value is not None and not 1 <= value <= MAX_CONCURRENCY_LIMIT:
        raise ValueError(
            f"must be a whole number from 1 to {MAX_CONCURRENCY_LIMIT:,} (batches of the store "
            "running at once across the cluster), or left out to keep the store's own limit"
        )
    return value
