"""Discovered stores: a row of a template's discovery source, validated as a store.

Each row names one store and may set its ``dsn``, ``schema``, ``table_prefix``, ``weight`` and
``concurrency_limit``; everything else comes from the template (``[templates.NAME]``,
:class:`~relayer.settings.TemplateSettings`). The store is called ``TEMPLATE.NAME``
(``tenants.acme``) and is validated exactly like a configured store: a row that breaks a rule
is skipped with one line naming the store, the field, the value and the rule (docs/fleet.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from relayer.errors import ConfigurationError
from relayer.settings.loading import configuration_error_from
from relayer.settings.stores import StoreSettings
from relayer.settings.templates import TemplateSettings, check_concurrency_limit, check_weight

ROW_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
ROW_NAME_RULE = (
    "a discovered store's name is letters, digits, '_', '.' or '-', starting with a letter or "
    "digit (the store is named TEMPLATE.NAME, at most 63 characters in all)"
)
# What a discovery row may set; the rest of a store's settings come from its template.
ROW_FIELDS = ("name", "dsn", "schema", "table_prefix", "weight", "concurrency_limit")


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
    def where(self) -> Tables:
        """The tables it uses: distinct stores must not share them."""
        return tables_of(self.settings)


# The tables a store uses: its database, schema and table prefix.
Tables = tuple[str | None, str, str]
# A row of a source as read: a row, or why it cannot be one (the row is skipped).
Row = DiscoveredRow | ConfigurationError


def tables_of(store: StoreSettings) -> Tables:
    return (store.dsn, store.db_schema, store.table_prefix)


def validate_rows(
    template: TemplateSettings, rows: Iterable[Row], taken: Mapping[Tables, str]
) -> tuple[dict[str, DiscoveredStore], list[ConfigurationError]]:
    """The stores ``rows`` yield, in order, and why each other row is skipped: it breaks a
    rule, names a store listed before, or uses the tables of a store listed before or of
    ``taken`` (the other stores served beside the template's: tables -> store name). The
    worker serves the stores; ``relayer status --all`` and the dashboard list the same."""
    found: dict[str, DiscoveredStore] = {}
    skipped: list[ConfigurationError] = []
    used = dict(taken)
    for row in rows:
        try:
            if isinstance(row, ConfigurationError):
                raise row
            store = store_from_row(template, row)
            if store.name in found:
                raise ConfigurationError(
                    f"stores.{store.name}",
                    str(row.name),
                    f"is listed twice ({row.where} and before); list each store once",
                )
            other = used.get(store.where)
            if other is not None:
                raise ConfigurationError(
                    f"stores.{store.name}",
                    f"{store.settings.db_schema}.{store.settings.table_prefix}*",
                    f"uses the same database, schema and table prefix as store {other!r}; "
                    "distinct stores must not share tables",
                )
        except ConfigurationError as exc:
            skipped.append(exc)
            continue
        used[store.where] = store.name
        found[store.name] = store
    return found, skipped


def row_from_mapping(values: Mapping[str, Any], where: str) -> DiscoveredRow:
    """A row from a file's table or a query's columns; an unknown field or no name is a
    ConfigurationError naming it (the row is skipped)."""
    unknown = [str(key) for key in values if key not in ROW_FIELDS]
    if unknown:
        raise ConfigurationError(
            f"{where}.{unknown[0]}",
            values[unknown[0]] if "dsn" not in unknown[0] else "***",
            f"is not a field a discovery row may set (fields: {', '.join(ROW_FIELDS)}); the "
            "template sets everything else",
        )
    if "name" not in values:
        raise ConfigurationError(
            f"{where}.name",
            None,
            "is required: the store's name (the store is called TEMPLATE.NAME); give the row "
            "a name",
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
        raise configuration_error_from(exc, prefix=prefix) from None
    weight = _number(row.weight, check_weight, f"{prefix}.weight")
    limit = _number(row.concurrency_limit, check_concurrency_limit, f"{prefix}.concurrency_limit")
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
