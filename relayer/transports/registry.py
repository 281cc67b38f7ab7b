"""From a store's transport settings to transport instances.

Built-in types are ``memory``, ``kafka``, ``rabbitmq``, ``nats``, ``redis``, ``webhooks`` and
``sqs``; any other ``type`` is looked up in the entry-point group ``relayer.transports``, whose
entries are factories ``factory(name, options) -> Transport`` (see ``TransportFactory``). The
broker modules are imported only when a store uses them, so relayer works without those extras.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from relayer.deadlines import Deadlines
from relayer.errors import ConfigurationError, install_command
from relayer.settings import StoreSettings, TransportSettings
from relayer.transports.base import Transport
from relayer.transports.options import TransportOptionError

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "relayer.transports"


@dataclass(frozen=True, slots=True)
class _BuiltIn:
    module: str
    factory: str
    extra: str | None
    driver: str | None


_BUILT_INS = {
    "memory": _BuiltIn("relayer.transports.memory", "MemoryTransport", None, None),
    "kafka": _BuiltIn("relayer.transports.kafka", "KafkaTransport", "kafka", "confluent_kafka"),
    "rabbitmq": _BuiltIn(
        "relayer.transports.rabbitmq", "RabbitMQTransport", "rabbitmq", "aio_pika"
    ),
    "nats": _BuiltIn("relayer.transports.nats", "NatsTransport", "nats", "nats"),
    "redis": _BuiltIn("relayer.transports.redis", "RedisTransport", "redis", "redis"),
    "webhooks": _BuiltIn("relayer.transports.webhooks", "WebhookTransport", "webhooks", "httpx"),
    "sqs": _BuiltIn("relayer.transports.sqs", "SQSTransport", "sqs", "aiobotocore"),
}


def known_types() -> list[str]:
    """Built-in transport types, then the installed plug-ins' names, without duplicates."""
    names = list(_BUILT_INS)
    names += sorted({entry.name for entry in _plugins()} - set(names))
    return names


def create_transport(
    store: str,
    name: str,
    settings: TransportSettings,
    *,
    batch_deadline: timedelta | None = None,
) -> Transport:
    """One transport instance, not started. ``batch_deadline`` informs built-in transports."""
    field = f"stores.{store}.transports.{name}"
    factory = _factory(field, settings.type, batch_deadline, store)
    try:
        transport = factory(name, settings.options)
    except ConfigurationError as exc:  # TransportOptionError, or a plug-in's own
        raise TransportOptionError(f"{field}.{exc.field}", exc.value, exc.rule) from exc
    if not isinstance(transport, Transport):
        raise ConfigurationError(
            f"{field}.type",
            settings.type,
            f"the factory returned {type(transport).__name__}, which does not implement the "
            "relayer Transport protocol (name, pipelines_within_key, start, ordered_by_key, "
            "publish, close); fix the plug-in",
        )
    logger.debug(
        "transport %s of store %s is a %s",
        name,
        store,
        settings.type,
        extra={"action": "transport", "store": store},
    )
    return transport


def create_transports(
    store: StoreSettings, *, batch_deadline: timedelta | None = None
) -> dict[str, Transport]:
    """Every transport of ``store``, by name. The batch deadline defaults to the store's
    (lease_duration / 2: relayer.deadlines)."""
    if batch_deadline is None:
        batch_deadline = timedelta(seconds=Deadlines.of(store.lease_duration).batch)
    deadline = batch_deadline
    return {
        name: create_transport(store.name, name, settings, batch_deadline=deadline)
        for name, settings in store.transports.items()
    }


_Factory = Callable[[str, Mapping[str, Any]], Any]


def _factory(field: str, kind: str, batch_deadline: timedelta | None, store: str) -> _Factory:
    built_in = _BUILT_INS.get(kind)
    if built_in is not None:
        cls = _import_built_in(field, kind, built_in)
        if kind == "kafka":
            return lambda name, options: cls.from_options(
                name, options, batch_deadline=batch_deadline, store=store
            )
        factory: _Factory = cls.from_options
        return factory
    for entry in _plugins():
        if entry.name == kind:
            return _load_plugin(field, kind, entry)
    raise ConfigurationError(
        f"{field}.type",
        kind,
        f"is not a known transport type (known: {', '.join(known_types())}); fix the type or "
        f"install the package that registers it in the entry-point group {ENTRY_POINT_GROUP!r}",
    )


def _import_built_in(field: str, kind: str, built_in: _BuiltIn) -> Any:
    try:
        module = importlib.import_module(built_in.module)
    except ModuleNotFoundError as exc:
        if built_in.driver is None or exc.name is None or built_in.driver not in exc.name:
            raise
        raise ConfigurationError(
            f"{field}.type",
            kind,
            f"needs the {built_in.driver} package, which is not installed; install the "
            f"extra: {install_command(built_in.extra or kind)}",
        ) from exc
    return getattr(module, built_in.factory)


def _load_plugin(field: str, kind: str, entry: EntryPoint) -> _Factory:
    try:
        loaded = entry.load()
    except Exception as exc:  # a broken plug-in must name itself, whatever it raised
        raise ConfigurationError(
            f"{field}.type",
            kind,
            f"the plug-in entry point {entry.value!r} could not be loaded "
            f"({type(exc).__name__}: {exc}); reinstall or fix the plug-in package",
        ) from exc
    if not callable(loaded):
        raise ConfigurationError(
            f"{field}.type",
            kind,
            f"the plug-in entry point {entry.value!r} is not callable; it must be a factory "
            "factory(name, options) -> Transport",
        )
    factory: _Factory = loaded
    return factory


def _plugins() -> list[EntryPoint]:
    return list(entry_points(group=ENTRY_POINT_GROUP))
