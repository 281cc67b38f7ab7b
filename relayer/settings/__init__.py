"""Configuration: one settings object, built at the edge and passed down.

Sources, strongest first: keyword arguments, environment variables (``RELAYER_`` prefix, ``__``
for nesting, e.g. ``RELAYER_STORES__ORDERS__LANES=32``), then an optional TOML file
(``--config FILE``, else ``RELAYER_CONFIG``, else ``./relayer.toml`` when it exists). Every
rule is checked at start-up; a violation raises :class:`~relayer.errors.ConfigurationError`
naming the field, the value and the rule.

- ``values``: the value types (``Duration``, ``Count``, ...) and the checks they share;
- ``stores``: ``StoreSettings`` and ``TransportSettings`` (``[stores.NAME]``);
- ``templates``: ``TemplateSettings`` and ``DiscoverySettings`` (``[templates.NAME]``);
- ``worker``: ``WorkerSettings`` (``[worker]``);
- ``loading``: ``RelayerSettings``, ``load_settings`` and the one-line configuration errors.

The modules import one another by their full names, never this one.
"""

from relayer.settings.loading import (
    DEFAULT_CONFIG_FILE,
    RelayerSettings,
    config_file_path,
    configuration_error_from,
    load_settings,
    store_settings,
)
from relayer.settings.stores import (
    MAX_BACKOFF,
    MAX_BATCH,
    MAX_LEASE,
    MAX_WAKE_LINGER,
    MIN_DESTRUCTIVE_RETENTION,
    MIN_LEASE,
    STORE_NAME,
    STORE_NAME_RULE,
    StoreSettings,
    TransportSettings,
)
from relayer.settings.templates import (
    TEMPLATE_NAME,
    TEMPLATE_NAME_RULE,
    DiscoverySettings,
    TemplateSettings,
)
from relayer.settings.values import Count, Duration, OptionalDuration, check_dsn
from relayer.settings.worker import WorkerSettings

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "MAX_BACKOFF",
    "MAX_BATCH",
    "MAX_LEASE",
    "MAX_WAKE_LINGER",
    "MIN_DESTRUCTIVE_RETENTION",
    "MIN_LEASE",
    "STORE_NAME",
    "STORE_NAME_RULE",
    "TEMPLATE_NAME",
    "TEMPLATE_NAME_RULE",
    "Count",
    "DiscoverySettings",
    "Duration",
    "OptionalDuration",
    "RelayerSettings",
    "StoreSettings",
    "TemplateSettings",
    "TransportSettings",
    "WorkerSettings",
    "check_dsn",
    "config_file_path",
    "configuration_error_from",
    "load_settings",
    "store_settings",
]
