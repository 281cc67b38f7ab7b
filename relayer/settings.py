"""Configuration: one settings object, built at the edge and passed down.

Sources, strongest first: keyword arguments, environment variables (``RELAYER_`` prefix, ``__``
for nesting, e.g. ``RELAYER_STORES__ORDERS__LANES=32``), then an optional TOML file
(``--config FILE``, else ``RELAYER_CONFIG``, else ``./relayer.toml`` when it exists). Every
rule is checked at start-up; a violation raises :class:`~relayer.errors.ConfigurationError`
naming the field, the value and the rule.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from relayer.environment import check_environment
from relayer.errors import ConfigurationError, Shown
from relayer.identifiers import StoreNames, check_plain_identifier, check_table_prefix
from relayer.lanes import MAX_LANES
from relayer.pooler import Pooler, check_pooler, dsn_sets_options, same_pool
from relayer.redact import MASK, is_secret_name, redact, redact_mapping

STORE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
STORE_NAME_RULE = (
    "a store name is 1-63 characters: letters, digits, '_', '.' or '-', starting with a letter "
    "or digit (names are case-sensitive)"
)
MIN_LEASE = timedelta(seconds=1)
MAX_LEASE = timedelta(hours=1)
MAX_BATCH = 10_000
MAX_BACKOFF = timedelta(days=7)
_RANGES = {
    "lanes": (1, MAX_LANES),
    "batch_size": (1, MAX_BATCH),
    "max_attempts": (1, 1_000_000),
    "max_body_bytes": (1, 1024 * 1024 * 1024),
}

_DURATION = re.compile(r"\s*(?P<number>-?\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m|h|d)?\s*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def _parse_duration(value: object) -> object:
    """Accept seconds as a number, ``"250ms"``/``"30s"``/``"5m"``/``"1h"``/``"7d"``, or ISO 8601."""
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        if match:
            unit = match.group("unit") or "s"
            return timedelta(seconds=float(match.group("number")) * _UNIT_SECONDS[unit])
        if not value.strip().lstrip("-").startswith("P"):
            raise ValueError(
                "must be a duration: seconds as a number, a number with a unit "
                "('250ms', '30s', '5m', '1h', '7d') or ISO 8601 ('PT30S')"
            )
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
# Destructive retentions (dropping parked keys, forgetting sequence counters) below this are
# refused: a typo such as '30s' for '30d' must not delete what an operator still needs.
MIN_DESTRUCTIVE_RETENTION = timedelta(hours=1)
MAX_WAKE_LINGER = timedelta(seconds=1)


class TransportSettings(BaseModel):
    """One named transport of a store: its ``type`` and the options its factory accepts.

    Options other than ``type`` pass through unchanged to the transport (librdkafka settings
    for Kafka, the connection URL for RabbitMQ, ...). Secret-looking values never show in reprs.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str = Field(min_length=1)

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        yield "type", self.type
        yield "options", redact_mapping(self.options)


class StoreSettings(BaseModel):
    """One outbox store: a PostgreSQL database, a schema and a table prefix, and its tuning."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = "default"
    dsn: str | None = Field(default=None, repr=False)
    # A pooler in front of dsn (relayer.pooler): "transaction" keeps no session state.
    pooler: Annotated[Pooler, BeforeValidator(check_pooler)] = "none"
    # Where LISTEN runs (a direct connection or a session-mode pool), and where the schema
    # commands connect; both default to dsn (LISTEN: not through a transaction pooler).
    listen_dsn: str | None = Field(default=None, repr=False)
    admin_dsn: str | None = Field(default=None, repr=False)
    db_schema: str = Field(default="public", alias="schema")
    table_prefix: str = "relayer_"
    lanes: Count = 64
    lease_duration: Duration = timedelta(seconds=30)
    poll_interval: Duration = timedelta(seconds=1)
    batch_size: Count = 500
    max_attempts: Count = 10
    retry_backoff: Duration = timedelta(seconds=1)
    retry_backoff_max: Duration = timedelta(minutes=5)
    max_body_bytes: Count = 16 * 1024 * 1024
    notify: bool = True
    # Wake-ups (writers' notifications) that arrive within this window are served together:
    # one probe-free pass and shared batch transactions instead of one each (0: at once).
    wake_linger: Duration = timedelta(milliseconds=3)
    default_transport: str | None = None
    transports: dict[str, TransportSettings] = Field(default_factory=dict)
    # Unordered rows and maintenance (docs/unordered.md, docs/operations.md).
    unordered_grace: Duration = timedelta(seconds=30)
    maintenance_interval: Duration = timedelta(seconds=5)
    cleanup_interval: Duration = timedelta(minutes=1)
    parked_retention: OptionalDuration = None
    # The consumer inbox and per-key sequence numbers (docs/inbox.md).
    inbox_retention: OptionalDuration = timedelta(days=7)
    sequence_numbers: bool = False
    sequence_retention: OptionalDuration = None

    @field_validator("dsn", "listen_dsn", "admin_dsn")
    @classmethod
    def _check_dsn(cls, value: str | None) -> str | None:
        return check_dsn(value)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not STORE_NAME.fullmatch(value):
            raise ValueError(STORE_NAME_RULE)
        return value

    @field_validator("lanes", "batch_size", "max_attempts", "max_body_bytes")
    @classmethod
    def _check_ranges(cls, value: int, info: ValidationInfo) -> int:
        low, high = _RANGES[str(info.field_name)]
        if not low <= value <= high:
            raise ValueError(f"must be an integer from {low:,} to {high:,}")
        return value

    @field_validator("db_schema")
    @classmethod
    def _check_schema(cls, value: str) -> str:
        value = _as_value_error(check_plain_identifier, "schema", value)
        if value == "information_schema" or value.startswith("pg_"):
            raise ValueError(
                "is a PostgreSQL system schema (pg_* and information_schema are reserved, and "
                "pg_dump leaves them out); use a schema of your own, such as 'relayer' or 'public'"
            )
        return value

    @field_validator("table_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        return _as_value_error(check_table_prefix, "table_prefix", value)

    @field_validator("lease_duration")
    @classmethod
    def _check_lease(cls, value: timedelta) -> timedelta:
        if not MIN_LEASE <= value <= MAX_LEASE:
            raise ValueError("must be from 1 second to 1 hour")
        return value

    @field_validator("poll_interval", "retry_backoff", "retry_backoff_max")
    @classmethod
    def _check_positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be greater than 0")
        if value > MAX_BACKOFF:
            raise ValueError("must be at most 7 days")
        return value

    @field_validator("unordered_grace")
    @classmethod
    def _check_grace(cls, value: timedelta) -> timedelta:
        if not timedelta(0) <= value <= timedelta(days=1):
            raise ValueError("must be from 0 seconds to 1 day")
        return value

    @field_validator("wake_linger")
    @classmethod
    def _check_linger(cls, value: timedelta) -> timedelta:
        if not timedelta(0) <= value <= MAX_WAKE_LINGER:
            raise ValueError("must be from 0 (off) to 1 second")
        return value

    @field_validator("maintenance_interval", "cleanup_interval")
    @classmethod
    def _check_interval(cls, value: timedelta) -> timedelta:
        if not timedelta(0) < value <= timedelta(days=1):
            raise ValueError("must be greater than 0 and at most 1 day")
        return value

    @field_validator("inbox_retention")
    @classmethod
    def _check_inbox_retention(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError("must be greater than 0, or 'off' to keep inbox entries forever")
        return value

    @field_validator("parked_retention", "sequence_retention")
    @classmethod
    def _check_destructive_retention(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < MIN_DESTRUCTIVE_RETENTION:
            raise ValueError(
                "must be at least 1 hour (it deletes data an operator may still need), "
                "or 'off' (the default)"
            )
        return value

    @model_validator(mode="after")
    def _check_relations(self) -> StoreSettings:
        if self.poll_interval >= self.lease_duration / 3:
            raise _RelationError(
                "poll_interval",
                _as_text(self.poll_interval),
                "must be less than lease_duration / 3 "
                f"({self.lease_duration.total_seconds() / 3:g} s for lease_duration "
                f"{self.lease_duration.total_seconds():g} s)",
            )
        if self.wake_linger >= self.poll_interval:
            raise _RelationError(
                "wake_linger",
                _as_text(self.wake_linger),
                f"must be less than poll_interval ({self.poll_interval.total_seconds():g} s)",
            )
        if self.retry_backoff_max < self.retry_backoff:
            raise _RelationError(
                "retry_backoff_max",
                _as_text(self.retry_backoff_max),
                f"must be at least retry_backoff ({self.retry_backoff.total_seconds():g} s)",
            )
        if self.default_transport is not None and self.default_transport not in self.transports:
            raise _RelationError(
                "default_transport",
                self.default_transport,
                f"must name one of this store's transports ({_names(self.transports)})",
            )
        self.check_pooled(self.dsn, "dsn")
        return self

    def check_pooled(self, dsn: str | None, field: str) -> None:
        """Refuse what a transaction pooler cannot serve: ``options`` in a DSN it is in front
        of, and a ``listen_dsn`` that reaches the same pool (LISTEN would never fire)."""
        if self.pooler != "transaction" or not dsn:
            return
        if dsn_sets_options(dsn):
            raise _RelationError(
                field,
                dsn,
                "sets options, which a pooler in transaction mode refuses at connect (pooler = "
                "'transaction'); set them on the role (ALTER ROLE ... SET) or remove them",
            )
        if self.listen_dsn and same_pool(self.listen_dsn, dsn):
            raise _RelationError(
                "listen_dsn",
                self.listen_dsn,
                "reaches the same pool as dsn, which pools by transaction (pooler = "
                "'transaction'), where LISTEN never fires; point it at the database directly "
                "or at a session-mode pool, or leave it out to poll",
            )

    @property
    def names(self) -> StoreNames:
        return StoreNames(self.db_schema, self.table_prefix)

    def require_dsn(self) -> str:
        """The store's DSN, or a configuration error saying how to set it."""
        if not self.dsn:
            raise ConfigurationError(
                f"stores.{self.name}.dsn",
                None,
                f"is required to connect; set it in [stores.{self.name}] or with "
                f"RELAYER_STORES__{self.name.upper()}__DSN (or RELAYER_DSN for every store)",
            )
        return self.dsn

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        yield "name", self.name
        for field in type(self).model_fields:
            value = getattr(self, field)
            if field.endswith("dsn"):
                yield field, redact(value) if value else None
            elif field != "name":
                yield field, value


class WorkerSettings(BaseModel):
    """How a ``relayer run`` process schedules lane scans across its stores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool_size: Count = Field(default=20, ge=1, le=10_000)
    policy: Literal["strict", "weighted"] = "weighted"
    weights: dict[str, Count] = Field(default_factory=dict)
    # Connections the process may hold open to PostgreSQL, all its stores together
    # (relayer.store.databases); unset: what its databases and pool_size need, logged at start.
    max_connections: Count | None = Field(default=None, ge=1, le=100_000)
    # A batch connection unused this long is closed (an idle database holds none).
    batch_max_idle: Duration = timedelta(seconds=60)

    @field_validator("batch_max_idle")
    @classmethod
    def _check_max_idle(cls, value: timedelta) -> timedelta:
        if not timedelta(0) < value <= timedelta(days=1):
            raise ValueError("must be greater than 0 and at most 1 day")
        return value

    @field_validator("weights")
    @classmethod
    def _check_weights(cls, value: dict[str, int]) -> dict[str, int]:
        for store, weight in value.items():
            if weight < 1:
                raise ValueError(f"the weight of store {store!r} is {weight}; weights are >= 1")
        return value


# Templates hold every store setting, so their module builds on this one's StoreSettings.
from relayer.fleet.templates import TEMPLATE_NAME, TEMPLATE_NAME_RULE, TemplateSettings  # noqa: E402


class RelayerSettings(BaseSettings):
    """Everything a relayer process is configured with."""

    model_config = SettingsConfigDict(
        env_prefix="RELAYER_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    dsn: str | None = Field(default=None, repr=False)
    stores: dict[str, StoreSettings] = Field(default_factory=dict)
    # Stores found by a discovery source, each from a template's settings (relayer.fleet).
    templates: dict[str, TemplateSettings] = Field(default_factory=dict)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"

    @field_validator("dsn")
    @classmethod
    def _check_dsn(cls, value: str | None) -> str | None:
        return check_dsn(value)

    @field_validator("stores", "templates", mode="before")
    @classmethod
    def _name_stores(cls, value: object) -> object:
        if isinstance(value, Mapping):
            named: dict[str, object] = {}
            for name, store in value.items():
                named[name] = {"name": name, **store} if isinstance(store, Mapping) else store
            return named
        return value

    @model_validator(mode="after")
    def _check_stores(self) -> RelayerSettings:
        seen: dict[tuple[str | None, str, str], str] = {}
        for name, store in self.stores.items():
            if store.name != name:
                raise _RelationError(f"stores.{name}.name", store.name, "must match its section")
            where = (store.dsn or self.dsn, store.db_schema, store.table_prefix)
            if where in seen:
                raise _RelationError(
                    f"stores.{name}",
                    f"{store.db_schema}.{store.table_prefix}*",
                    f"uses the same database, schema and table prefix as store "
                    f"{seen[where]!r}; distinct stores must not share tables",
                )
            seen[where] = name
            if store.dsn is None:
                try:
                    store.check_pooled(self.dsn, "dsn")
                except _RelationError as exc:
                    field = "dsn" if exc.field == "dsn" else f"stores.{name}.{exc.field}"
                    raise _RelationError(field, exc.value, exc.rule) from None
        self._check_templates()
        for name, weight in self.worker.weights.items():
            if name not in self.stores and name.partition(".")[0] not in self.templates:
                close = difflib.get_close_matches(name, list(self.stores), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                templates = " or TEMPLATE.NAME of a template" if self.templates else ""
                raise _RelationError(
                    f"worker.weights.{name}",
                    weight,
                    f"names no configured store{templates} (configured stores: "
                    f"{_names(self.stores)})" + hint,
                )
        return self

    def _check_templates(self) -> None:
        for name, template in self.templates.items():
            if template.name != name:
                raise _RelationError(
                    f"templates.{name}.name", template.name, "must match its section"
                )
            if template.dsn is None:
                try:
                    template.check_pooled(self.dsn, "dsn")
                except _RelationError as exc:
                    field = "dsn" if exc.field == "dsn" else f"templates.{name}.{exc.field}"
                    raise _RelationError(field, exc.value, exc.rule) from None
            if template.discovery.query is not None and not (template.catalog_dsn() or self.dsn):
                raise _RelationError(
                    f"templates.{name}.discovery.dsn",
                    None,
                    "is required for a query source: set the catalog database's DSN here, or "
                    f"templates.{name}.dsn (or the top-level dsn), where the query then runs",
                )
        for name in self.stores:
            prefix = name.partition(".")[0]
            if prefix in self.templates and "." in name:
                raise _RelationError(
                    f"stores.{name}",
                    name,
                    f"is named like a store of template {prefix!r} (its stores are "
                    "TEMPLATE.NAME); rename the store or the template",
                )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_file = _config_file.get()
        if config_file is None:
            return (init_settings, env_settings)
        return (
            init_settings,
            env_settings,
            TomlConfigSettingsSource(settings_cls, toml_file=config_file),
        )

    def store(self, name: str) -> StoreSettings:
        """The settings of store ``name``, inheriting the top-level ``dsn`` if it has none."""
        try:
            store = self.stores[name]
        except KeyError:
            if not STORE_NAME.fullmatch(name):
                raise ConfigurationError("store", name, STORE_NAME_RULE) from None
            if not self.stores:
                raise ConfigurationError(
                    "store",
                    name,
                    f"is not configured, and no store is: give a TOML file with --config FILE "
                    f"or RELAYER_CONFIG, holding a [stores.{name}] section, or set "
                    f"RELAYER_STORES__{name.upper()}__DSN",
                ) from None
            raise ConfigurationError(
                "store",
                name,
                f"is not configured (configured stores: {_names(self.stores)}); add a "
                f"[stores.{name}] section to the config file or set "
                f"RELAYER_STORES__{name.upper()}__DSN",
            ) from None
        if store.dsn is None and self.dsn is not None:
            store = store.model_copy(update={"dsn": self.dsn})
        return store

    def template(self, name: str) -> TemplateSettings:
        """The settings of template ``name``, inheriting the top-level ``dsn`` if it has none."""
        try:
            template = self.templates[name]
        except KeyError:
            if not TEMPLATE_NAME.fullmatch(name):
                raise ConfigurationError("template", name, TEMPLATE_NAME_RULE) from None
            raise ConfigurationError(
                "template",
                name,
                f"is not configured (configured templates: {_names(self.templates)}); add a "
                f"[templates.{name}] section with its [templates.{name}.discovery] source to "
                "the config file (docs/fleet.md)",
            ) from None
        if template.dsn is None and self.dsn is not None:
            template = template.model_copy(update={"dsn": self.dsn})
        return template

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        yield "dsn", redact(self.dsn) if self.dsn else None
        for field in type(self).model_fields:
            if field != "dsn":
                yield field, getattr(self, field)


_config_file: ContextVar[Path | None] = ContextVar("relayer_config_file", default=None)


class _RelationError(ValueError):
    """A rule that ties several fields together, raised from a model validator."""

    def __init__(self, field: str, value: object, rule: str) -> None:
        super().__init__(rule)
        self.field = field
        self.value = value
        self.rule = rule


DEFAULT_CONFIG_FILE = Path("relayer.toml")


def config_file_path(config_file: str | Path | None = None) -> Path | None:
    """The TOML file the settings come from, or None for none.

    The first that applies: ``config_file`` (``--config``); ``RELAYER_CONFIG`` (set but empty:
    no file at all); ``relayer.toml`` in the current directory when it exists.
    """
    if config_file is not None:
        return Path(config_file)
    from_environment = os.environ.get("RELAYER_CONFIG")
    if from_environment is not None:
        return Path(from_environment) if from_environment else None
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.is_file() else None


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> RelayerSettings:
    """Build the settings from ``overrides``, the environment and a TOML file.

    The file is ``config_file``, else ``RELAYER_CONFIG``, else ``./relayer.toml`` when it exists
    (see :func:`config_file_path`). Raises ConfigurationError on any rule.
    """
    path = config_file_path(config_file)
    if path is not None:
        _check_toml(path)
    check_environment(os.environ, RelayerSettings)
    token = _config_file.set(path)
    try:
        return RelayerSettings(**overrides)
    except ValidationError as exc:
        raise configuration_error_from(exc) from None
    except SettingsError as exc:  # a shape check_environment does not foresee
        raise ConfigurationError(
            "environment", None, f"{exc}; check the RELAYER_ variables' nesting"
        ) from None
    finally:
        _config_file.reset(token)


def store_settings(**values: Any) -> StoreSettings:
    """Build one StoreSettings from keyword values, translating errors like load_settings."""
    try:
        return StoreSettings(**values)
    except ValidationError as exc:
        raise configuration_error_from(
            exc, prefix=f"stores.{values.get('name', 'default')}"
        ) from None


def configuration_error_from(exc: ValidationError, prefix: str = "") -> ConfigurationError:
    """One ConfigurationError (field, value, rule) for the first problem in ``exc``."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    location = [str(part) for part in first["loc"]]
    value: object = first.get("input")
    rule = first["msg"]
    context = first.get("ctx") or {}
    error = context.get("error")
    if isinstance(error, _RelationError):
        location = [*location, *error.field.split(".")] if error.field else location
        value, rule = error.value, error.rule
    elif isinstance(error, ConfigurationError):
        value, rule = error.value, error.rule
    elif first["type"] == "extra_forbidden":
        close = difflib.get_close_matches(location[-1], _setting_names(), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        rule = f"is not a setting relayer knows{hint}; fix its name or remove it"
    elif rule.startswith("Value error, "):
        rule = rule.removeprefix("Value error, ")
    field = ".".join(part for part in ([prefix] if prefix else []) + location if part)
    if not field:
        field = "settings"
    if any(is_secret_name(part) or part.endswith("dsn") for part in location):
        value = MASK if value is not None else None
    elif isinstance(value, str):
        value = redact(value)
    elif isinstance(value, Mapping):
        value = Shown.names_of(value)  # a whole table would bury the one line in its values
    if len(errors) > 1:
        rule = f"{rule} (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return ConfigurationError(field or "settings", value, rule)


_QUOTED = re.compile(r'"[^"]*"')


def check_dsn(value: str | None) -> str | None:
    """A DSN libpq can parse (a ``postgresql://`` URL or key=value pairs), or None.

    The reason libpq gives quotes pieces of the DSN, which may be pieces of a password, so
    they are left out of the error.
    """
    if not value:
        return value
    from psycopg import ProgrammingError  # libpq is the authority on what parses
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(value)
    except ProgrammingError as exc:
        reason = _QUOTED.sub(_elide_quoted, str(exc).strip().splitlines()[0] if str(exc) else "")
        raise ValueError(
            f"is not a PostgreSQL connection string ({reason}); use a postgresql:// URL "
            "(percent-encode spaces as %20) or key=value pairs, putting a value that contains "
            "spaces in single quotes"
        ) from None
    return value


def _setting_names() -> list[str]:
    from relayer.fleet.templates import DiscoverySettings

    models: tuple[type[BaseModel], ...] = (
        RelayerSettings,
        StoreSettings,
        WorkerSettings,
        TemplateSettings,
        DiscoverySettings,
    )
    return sorted(
        {field.alias or name for model in models for name, field in model.model_fields.items()}
    )


def _elide_quoted(match: re.Match[str]) -> str:
    return match[0] if match[0] == '"="' else '"..."'


def _as_value_error(check: Any, field: str, value: str) -> str:
    try:
        result: str = check(field, value)
    except ConfigurationError as exc:
        raise ValueError(exc.rule) from None
    return result


def _as_text(value: timedelta) -> str:
    return f"{value.total_seconds():g}s"


def _names(mapping: Mapping[str, object]) -> str:
    return ", ".join(repr(name) for name in mapping) or "none"


def _check_toml(path: Path) -> None:
    try:
        with path.open("rb") as handle:
            tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigurationError("config", str(path), "the file does not exist") from None
    except IsADirectoryError:
        raise ConfigurationError("config", str(path), "is a directory, not a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError("config", str(path), f"is not valid TOML: {exc}") from None
