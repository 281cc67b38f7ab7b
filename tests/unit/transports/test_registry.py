"""Resolving transport settings to instances: built-ins, plug-ins, clear errors."""

from __future__ import annotations

import importlib
from datetime import timedelta
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from relayer.errors import ConfigurationError
from relayer.settings import TransportSettings, store_settings
from relayer.transports import registry
from relayer.transports.memory import MemoryTransport
from relayer.transports.registry import create_transport, create_transports, known_types


def settings(kind: str, **options: Any) -> TransportSettings:
    return TransportSettings(type=kind, **options)


def test_built_in_types() -> None:
    assert known_types()[:5] == ["memory", "kafka", "rabbitmq", "nats", "redis"]
    memory = create_transport("orders", "test", settings("memory", pipelines_within_key=False))
    assert isinstance(memory, MemoryTransport) and memory.name == "test"
    kafka = create_transport("orders", "events", settings("kafka", bootstrap_servers="k:9092"))
    assert kafka.pipelines_within_key is True and "k:9092" in repr(kafka)
    # TOML's unquoted dotted keys arrive as nested tables.
    nested = settings("kafka", bootstrap={"servers": "k:9093"}, linger={"ms": 5})
    assert "'linger.ms': 5" in repr(create_transport("orders", "events", nested))
    rabbit = create_transport(
        "orders", "bus", settings("rabbitmq", url="amqp://u:secret@h/", ordered_destinations="x")
    )
    assert rabbit.pipelines_within_key is False
    assert "secret" not in repr(rabbit)


def test_a_store_gets_every_transport_with_its_batch_deadline() -> None:
    store = store_settings(
        name="orders",
        lease_duration="30s",
        transports={
            "events": {"type": "kafka", "bootstrap.servers": "k:9092"},
            "memory": {"type": "memory"},
        },
    )
    transports = create_transports(store)
    assert set(transports) == {"events", "memory"}
    # The deadline is lease / 2 = 15 s: a shorter librdkafka timeout is refused, naming the field.
    short = store_settings(
        name="orders",
        transports={
            "events": {"type": "kafka", "bootstrap.servers": "k", "message.timeout.ms": 9000}
        },
    )
    with pytest.raises(ConfigurationError) as caught:
        create_transports(short)
    assert caught.value.field == "stores.orders.transports.events.message.timeout.ms"
    assert create_transports(short, batch_deadline=timedelta(seconds=5))


def test_an_unknown_type_names_the_field_the_value_and_the_known_types() -> None:
    with pytest.raises(ConfigurationError) as caught:
        create_transport("orders", "bus", settings("carrier-pigeon"))
    error = caught.value
    assert error.field == "stores.orders.transports.bus.type"
    assert error.value == "carrier-pigeon"
    assert "memory, kafka, rabbitmq" in error.rule
    assert "relayer.transports" in error.rule


def test_bad_options_name_their_full_field() -> None:
    with pytest.raises(ConfigurationError) as caught:
        create_transport("orders", "bus", settings("rabbitmq", url="amqp://h/", max_outstanding=0))
    assert caught.value.field == "stores.orders.transports.bus.max_outstanding"
    with pytest.raises(ConfigurationError, match="url"):
        create_transport("orders", "bus", settings("rabbitmq"))


def test_a_missing_extra_says_which_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def without_kafka(name: str, package: str | None = None) -> Any:
        if name == "relayer.transports.kafka":
            raise ModuleNotFoundError("No module named 'confluent_kafka'", name="confluent_kafka")
        return real(name, package)

    monkeypatch.setattr(registry.importlib, "import_module", without_kafka)
    with pytest.raises(ConfigurationError) as caught:
        create_transport("orders", "events", settings("kafka"))
    assert "pip install 'relayer-outbox[kafka]'" in str(caught.value)


def make_memory(name: str, options: Any) -> MemoryTransport:
    return MemoryTransport(name)


def not_a_transport(name: str, options: Any) -> object:
    return object()


def plugin(monkeypatch: pytest.MonkeyPatch, name: str, target: str) -> None:
    entry = EntryPoint(name=name, value=target, group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "_plugins", lambda: [entry])


def test_plug_ins_come_from_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin(monkeypatch, "custom", f"{__name__}:make_memory")
    assert "custom" in known_types()
    assert isinstance(create_transport("orders", "c", settings("custom")), MemoryTransport)


def test_broken_plug_ins_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin(monkeypatch, "custom", "no_such_module_here:factory")
    with pytest.raises(ConfigurationError, match="could not be loaded"):
        create_transport("orders", "c", settings("custom"))
    plugin(monkeypatch, "custom", f"{__name__}:not_a_transport")
    with pytest.raises(ConfigurationError, match="does not implement"):
        create_transport("orders", "c", settings("custom"))


def refusing_factory(name: str, options: Any) -> object:
    raise ConfigurationError("directory", options.get("directory"), "must exist")


def test_a_plug_in_option_error_names_the_store_and_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plugin(monkeypatch, "audit", f"{__name__}:refusing_factory")
    with pytest.raises(ConfigurationError) as caught:
        create_transport("orders", "trail", settings("audit", directory="/nope"))
    assert str(caught.value) == (
        "stores.orders.transports.trail.directory: '/nope' is invalid: must exist"
    )
