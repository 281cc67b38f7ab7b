"""The settings of a relayer process, and where they come from.

Sources, strongest first: keyword arguments, environment variables (``RELAYER_`` prefix, ``__``
for nesting), then an optional TOML file (``--config FILE``, else ``RELAYER_CONFIG``, else
``./relayer.toml`` when it exists). A violated rule becomes one
:class:`~relayer.errors.ConfigurationError` naming the field, the value and the rule.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from relayer.environment import check_environment
from relayer.errors import ConfigurationError, Shown
from relayer.redact import MASK, is_secret_name, redact
from relayer.settings.stores import STORE_NAME, STORE_NAME_RULE, StoreSettings
from relayer.settings.templates import (
    TEMPLATE_NAME,
    TEMPLATE_NAME_RULE,
    DiscoverySettings,
    TemplateSettings,
)
from relayer.settings.values import RelationError, check_dsn, listed_names
from relayer.settings.worker import WorkerSettings

# The TOML file load_settings reads, for RelayerSettings' sources (None: no file).
_config_file: ContextVar[Path | None] = ContextVar("relayer_config_file", default=None)


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
                raise RelationError(f"stores.{name}.name", store.name, "must match its section")
            where = (store.dsn or self.dsn, store.db_schema, store.table_prefix)
            if where in seen:
                raise RelationError(
                    f"stores.{name}",
                    f"{store.db_schema}.{store.table_prefix}*",
                    f"uses the same database, schema and table prefix as store "
                    f"{seen[where]!r}; distinct stores must not share tables",
                )
            seen[where] = name
            self._check_pooled_default("stores", store)
        self._check_templates()
        for name, weight in self.worker.weights.items():
            if name in self.templates and name not in self.stores:
                raise RelationError(
                    f"worker.weights.{name}",
                    weight,
                    f"names template {name!r}, not a store; weigh all its stores with "
                    f'templates.{name}.weight, or one of them as "{name}.NAME"',
                )
            if name not in self.stores and name.partition(".")[0] not in self.templates:
                close = difflib.get_close_matches(name, list(self.stores), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                templates = " or TEMPLATE.NAME of a template" if self.templates else ""
                raise RelationError(
                    f"worker.weights.{name}",
                    weight,
                    f"names no configured store{templates} (configured stores: "
                    f"{listed_names(self.stores)})" + hint,
                )
        return self

    def _check_templates(self) -> None:
        for name, template in self.templates.items():
            if template.name != name:
                raise RelationError(
                    f"templates.{name}.name", template.name, "must match its section"
                )
            self._check_pooled_default("templates", template)
            if template.discovery.query is not None and not (template.catalog_dsn() or self.dsn):
                raise RelationError(
                    f"templates.{name}.discovery.dsn",
                    None,
                    "is required for a query source: set the catalog database's DSN here, or "
                    f"templates.{name}.dsn (or the top-level dsn), where the query then runs",
                )
        for name in self.stores:
            prefix = name.partition(".")[0]
            if prefix in self.templates and "." in name:
                raise RelationError(
                    f"stores.{name}",
                    name,
                    f"is named like a store of template {prefix!r} (its stores are "
                    "TEMPLATE.NAME); rename the store or the template",
                )

    def _check_pooled_default(self, section: str, store: StoreSettings) -> None:
        """A store (or template) without a dsn of its own connects to the top-level dsn: check
        that one against its pooler, naming the top-level field when the dsn is at fault."""
        if store.dsn is not None:
            return
        try:
            store.check_pooled(self.dsn, "dsn")
        except RelationError as exc:
            field = "dsn" if exc.field == "dsn" else f"{section}.{store.name}.{exc.field}"
            raise RelationError(field, exc.value, exc.rule) from None

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
                f"is not configured (configured stores: {listed_names(self.stores)}); add a "
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
                f"is not configured (configured templates: {listed_names(self.templates)}); add a "
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
    if isinstance(error, RelationError):
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


def _setting_names() -> list[str]:
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


def _check_toml(path: Path) -> None:
    try:
        with path.open("rb") as handle:
            tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigurationError("config", str(path), "the file does not exist") from None
    except IsADirectoryError:
        raise ConfigurationError("config", str(path), "is a directory, not a TOML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigurationError(
            "config",
            str(path),
            f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start} "
            "cannot be decoded); TOML files are UTF-8: save it as UTF-8",
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError("config", str(path), f"is not valid TOML: {exc}") from None
