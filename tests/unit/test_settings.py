from datetime import timedelta
from pathlib import Path

import pytest

from relayer.errors import ConfigurationError
from relayer.redact import is_secret_name, redact, redact_mapping
from relayer.settings import config_file_path, load_settings, store_settings

HOSTILE_IDENTIFIERS = [
    'x"; drop table y; --',
    "a" * 64,
    "Orders",
    "",
    "1abc",
    "has space",
    "ünïcode",
    "semi;colon",
]


def error_of(**store: object) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(stores={"orders": store})
    return caught.value


def test_defaults_are_valid() -> None:
    store = store_settings(name="orders")
    assert store.lanes == 64
    assert store.batch_size == 500
    assert store.lease_duration == timedelta(seconds=30)
    assert store.poll_interval == timedelta(seconds=1)
    assert store.db_schema == "public"
    assert store.table_prefix == "relayer_"


@pytest.mark.parametrize("lanes", [1, 64, 65_536])
def test_lanes_in_range(lanes: int) -> None:
    assert store_settings(lanes=lanes).lanes == lanes


@pytest.mark.parametrize("lanes", [0, -5, 65_537, "many"])
def test_lanes_out_of_range(lanes: object) -> None:
    error = error_of(lanes=lanes)
    assert error.field == "stores.orders.lanes"
    assert error.value == lanes
    assert "1 to 65,536" in error.rule or "integer" in error.rule


@pytest.mark.parametrize("batch", [1, 10_000])
def test_batch_size_in_range(batch: int) -> None:
    assert store_settings(batch_size=batch).batch_size == batch


@pytest.mark.parametrize("batch", [0, 10_001])
def test_batch_size_out_of_range(batch: int) -> None:
    error = error_of(batch_size=batch)
    assert error.field == "stores.orders.batch_size"
    assert "1 to 10,000" in error.rule


@pytest.mark.parametrize(
    ("lease", "poll"), [("1s", "0.3s"), ("1h", "1s"), (30, 9.9), ("PT10M", "2s")]
)
def test_lease_and_poll_accepted(lease: object, poll: object) -> None:
    store = store_settings(lease_duration=lease, poll_interval=poll)
    assert store.poll_interval < store.lease_duration / 3


@pytest.mark.parametrize("lease", ["999ms", "0s", "3601s", "2h"])
def test_lease_out_of_range(lease: str) -> None:
    error = error_of(lease_duration=lease, poll_interval="1ms")
    assert error.field == "stores.orders.lease_duration"
    assert error.value == lease
    assert "1 second to 1 hour" in error.rule


@pytest.mark.parametrize("poll", ["0s", "-1s"])
def test_poll_interval_must_be_positive(poll: str) -> None:
    error = error_of(poll_interval=poll)
    assert error.field == "stores.orders.poll_interval"
    assert "greater than 0" in error.rule


@pytest.mark.parametrize("poll", ["10s", "11s"])
def test_poll_interval_must_be_below_a_third_of_the_lease(poll: str) -> None:
    error = error_of(lease_duration="30s", poll_interval=poll)
    assert error.field == "stores.orders.poll_interval"
    assert "lease_duration / 3" in error.rule
    assert "10 s" in error.rule


@pytest.mark.parametrize(("linger", "words"), [("-1ms", "from 0"), ("2s", "from 0")])
def test_wake_linger_is_bounded(linger: str, words: str) -> None:
    error = error_of(wake_linger=linger)
    assert error.field == "stores.orders.wake_linger"
    assert words in error.rule


def test_wake_linger_must_be_below_the_poll_interval() -> None:
    error = error_of(poll_interval="100ms", wake_linger="100ms")
    assert error.field == "stores.orders.wake_linger"
    assert "poll_interval" in error.rule


@pytest.mark.parametrize("name", HOSTILE_IDENTIFIERS)
def test_hostile_schema_names_are_rejected(name: str) -> None:
    error = error_of(schema=name)
    assert error.field == "stores.orders.schema"
    assert error.value == name
    assert "identifier" in error.rule or "63" in error.rule


@pytest.mark.parametrize("name", HOSTILE_IDENTIFIERS)
def test_hostile_prefixes_are_rejected(name: str) -> None:
    error = error_of(table_prefix=name)
    assert error.field == "stores.orders.table_prefix"
    assert error.value == name


def test_prefix_length_counts_the_longest_object_name() -> None:
    longest_ok = "p" * 49
    assert store_settings(table_prefix=longest_ok).table_prefix == longest_ok
    error = error_of(table_prefix="p" * 50)
    assert "63" in error.rule
    assert "at most 49" in error.rule


def test_schema_of_63_bytes_is_accepted_and_64_rejected() -> None:
    assert store_settings(schema="s" * 63).db_schema == "s" * 63
    assert "63" in error_of(schema="s" * 64).rule


def test_store_names_are_validated() -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(stores={"bad name": {}})
    assert caught.value.field == "stores.bad name.name"


def test_store_names_are_case_sensitive() -> None:
    settings = load_settings(
        stores={"Orders": {"table_prefix": "a_"}, "orders": {"table_prefix": "b_"}}
    )
    assert set(settings.stores) == {"Orders", "orders"}


def test_two_stores_sharing_tables_are_rejected() -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(stores={"a": {}, "b": {}})
    assert "same database, schema and table prefix" in caught.value.rule


def test_unknown_fields_are_rejected() -> None:
    error = error_of(lanez=3)
    assert error.field == "stores.orders.lanez"


def test_unknown_store_names_the_configured_ones() -> None:
    settings = load_settings(stores={"orders": {}})
    with pytest.raises(ConfigurationError) as caught:
        settings.store("billing")
    assert caught.value.field == "store"
    assert caught.value.value == "billing"
    assert "'orders'" in caught.value.rule


def test_missing_dsn_explains_how_to_set_it() -> None:
    store = load_settings(stores={"orders": {}}).store("orders")
    with pytest.raises(ConfigurationError) as caught:
        store.require_dsn()
    assert "RELAYER_STORES__ORDERS__DSN" in caught.value.rule


def test_top_level_dsn_is_inherited() -> None:
    settings = load_settings(dsn="postgresql://a@h/db", stores={"orders": {}})
    assert settings.store("orders").dsn == "postgresql://a@h/db"


def test_environment_with_nesting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYER_STORES__ORDERS__LANES", "32")
    monkeypatch.setenv("RELAYER_STORES__ORDERS__LEASE_DURATION", "20s")
    monkeypatch.setenv("RELAYER_WORKER__POOL_SIZE", "7")
    settings = load_settings()
    assert settings.store("orders").lanes == 32
    assert settings.store("orders").lease_duration == timedelta(seconds=20)
    assert settings.worker.pool_size == 7


def test_toml_file_and_environment_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "relayer.toml"
    config.write_text(
        '[stores.orders]\nschema = "messaging"\ntable_prefix = "orders_"\nlanes = 32\n'
        "batch_size = 100\n"
        '[stores.orders.transports.kafka]\ntype = "kafka"\n"bootstrap.servers" = "127.0.0.1:9092"\n'
    )
    monkeypatch.setenv("RELAYER_STORES__ORDERS__BATCH_SIZE", "250")
    store = load_settings(config).store("orders")
    assert store.db_schema == "messaging"
    assert store.lanes == 32
    assert store.batch_size == 250  # the environment wins over the file
    assert store.transports["kafka"].type == "kafka"
    assert store.transports["kafka"].options == {"bootstrap.servers": "127.0.0.1:9092"}


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "relayer.toml"
    config.write_text("[stores.billing]\nlanes = 4\n")
    monkeypatch.setenv("RELAYER_CONFIG", str(config))
    assert load_settings().store("billing").lanes == 4


def test_relayer_toml_in_the_current_directory_is_read_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "relayer.toml").write_text("[stores.billing]\nlanes = 4\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RELAYER_CONFIG", raising=False)
    assert config_file_path() == Path("relayer.toml")
    assert load_settings().store("billing").lanes == 4


def test_config_file_precedence_argument_then_environment_then_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "relayer.toml").write_text("[stores.billing]\nlanes = 4\n")
    (tmp_path / "from-environment.toml").write_text("[stores.billing]\nlanes = 8\n")
    (tmp_path / "from-argument.toml").write_text("[stores.billing]\nlanes = 16\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RELAYER_CONFIG", "from-environment.toml")
    assert load_settings("from-argument.toml").store("billing").lanes == 16
    assert load_settings().store("billing").lanes == 8
    monkeypatch.setenv("RELAYER_CONFIG", "")  # set but empty: no file, not even ./relayer.toml
    assert config_file_path() is None
    assert load_settings().stores == {}


def test_no_relayer_toml_in_the_current_directory_means_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "relayer.toml").mkdir()  # not a file: ignored, not an error
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RELAYER_CONFIG", raising=False)
    assert config_file_path() is None
    assert load_settings().stores == {}


def test_errors_in_the_toml_file_name_the_field(tmp_path: Path) -> None:
    config = tmp_path / "relayer.toml"
    config.write_text("[stores.orders]\nbatch_size = 0\n")
    with pytest.raises(ConfigurationError) as caught:
        load_settings(config)
    assert caught.value.field == "stores.orders.batch_size"


def test_missing_and_malformed_config_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[stores.orders\n")
    with pytest.raises(ConfigurationError, match="not valid TOML"):
        load_settings(broken)


def test_dsn_password_never_shows_in_repr_or_errors() -> None:
    secret = "s3cr3t-pa55"
    settings = load_settings(
        dsn=f"postgresql://app:{secret}@db/prod",
        stores={"orders": {"dsn": f"host=db password={secret} dbname=x"}},
    )
    assert secret not in repr(settings)
    assert secret not in str(settings)
    assert secret not in repr(settings.store("orders"))
    with pytest.raises(ConfigurationError) as caught:
        load_settings(stores={"orders": {"dsn": f"postgresql://a:{secret}@h/db", "lanes": 0}})
    assert secret not in str(caught.value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings(stores={"orders": {"dsn": {"password": secret}}})
    assert secret not in str(caught.value)


def test_transport_secrets_never_show_in_repr() -> None:
    store = store_settings(
        transports={
            "kafka": {"type": "kafka", "sasl.password": "hunter2", "bootstrap.servers": "h:1"},
            "rabbit": {"type": "rabbitmq", "url": "amqp://u:hunter3@h/"},
        }
    )
    text = repr(store)
    assert "hunter2" not in text
    assert "hunter3" not in text
    assert "h:1" in text


def test_default_transport_must_exist() -> None:
    error = error_of(default_transport="kafka")
    assert error.field == "stores.orders.default_transport"
    assert error.value == "kafka"


def test_worker_weights_must_be_positive() -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(worker={"weights": {"orders": 0}})
    assert caught.value.field == "worker.weights"


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://user:pw@host:5432/db",
        "amqp://guest:pw@127.0.0.1:5672/",
        "host=h password=pw user=u",
        "host=h password='p w' user=u",
        "postgresql://u@h/db?password=pw&sslmode=require",
    ],
)
def test_redact_removes_passwords(text: str) -> None:
    shown = redact(text)
    assert "pw" not in shown.replace("pwd", "")
    assert "p w" not in shown
    assert "***" in shown


def test_backoffs_are_bounded() -> None:
    error = error_of(retry_backoff="8d", retry_backoff_max="9d")
    assert error.field == "stores.orders.retry_backoff"
    assert "at most 7 days" in error.rule


@pytest.mark.parametrize(
    "name",
    ["sasl.password", "sasl.passowrd", "sasl.pasword", "ssl.key.password", "client.secert",
     "sasl.oauthbearer.client.secret", "api_key", "ssl.keystore.location", "access_token"],
)  # fmt: skip
def test_secret_setting_names_are_masked_even_misspelled(name: str) -> None:
    assert is_secret_name(name)
    assert redact_mapping({name: "hunter2", "bootstrap.servers": "k:9092"}) == {
        name: "***",
        "bootstrap.servers": "k:9092",
    }


@pytest.mark.parametrize("name", ["bootstrap.servers", "linger.ms", "sasl.mechanisms", "acks"])
def test_ordinary_setting_names_are_shown(name: str) -> None:
    assert not is_secret_name(name)
