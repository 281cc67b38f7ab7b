"""Templates and discovery rows: validated like configured stores, with one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from relayer.dispatch.control import MAX_LIMIT
from relayer.errors import ConfigurationError
from relayer.fleet.sources import DiscoveryError, read_file, rows_from_columns
from relayer.fleet.templates import DiscoveredRow, store_from_row, validate_rows
from relayer.settings import RelayerSettings, TemplateSettings, load_settings
from relayer.settings.templates import MAX_CONCURRENCY_LIMIT

DSN = "postgresql://relayer:s3cret@db.internal/app"


def settings(**template: Any) -> RelayerSettings:
    values: dict[str, Any] = {"discovery": {"file": "stores.toml"}, **template}
    return load_settings(dsn=DSN, templates={"tenants": values})


def template(**values: Any) -> TemplateSettings:
    return settings(**values).template("tenants")


def error_of(**values: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        settings(**values)
    return caught.value


def row_error(row: DiscoveredRow, **values: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        store_from_row(template(**values), row)
    return caught.value


def test_a_template_holds_every_store_setting_and_its_stores_inherit_them() -> None:
    tenants = template(
        lanes=16,
        table_prefix="outbox_",
        lease_duration="9s",
        transports={"memory": {"type": "memory"}},
        default_transport="memory",
        weight=2,
        concurrency_limit=5,
    )
    assert tenants.dsn == DSN  # the top-level dsn, as for stores
    assert tenants.discover_interval == timedelta(seconds=30)
    found = store_from_row(tenants, DiscoveredRow("acme", schema="acme", where="row 1"))
    store = found.settings
    assert (store.name, store.db_schema, store.table_prefix) == ("tenants.acme", "acme", "outbox_")
    assert (store.lanes, store.lease_duration, store.dsn) == (16, timedelta(seconds=9), DSN)
    assert store.transports["memory"].type == "memory" and store.default_transport == "memory"
    assert (found.weight, found.concurrency_limit) == (2, 5)  # the template's
    own = store_from_row(
        tenants,
        DiscoveredRow("globex", dsn="postgresql://x@db2/g", weight=7, concurrency_limit=1.0),
    )
    assert (own.settings.dsn, own.weight, own.concurrency_limit) == ("postgresql://x@db2/g", 7, 1)
    assert "s3cret" not in repr(tenants) and "s3cret" not in repr(found.settings)


@pytest.mark.parametrize(
    ("values", "field", "rule"),
    [
        (
            {"poll_interval": "20s"},
            "templates.tenants.poll_interval",
            "must be less than lease_duration / 3",
        ),
        ({"discovery": {}}, "templates.tenants.discovery", "needs exactly one source"),
        (
            {"discovery": {"file": "a.toml", "query": "SELECT 1"}},
            "templates.tenants.discovery",
            "needs exactly one source",
        ),
        (
            {"discovery": {"file": "stores.yaml"}},
            "templates.tenants.discovery.file",
            "must be a .toml file",
        ),
        ({"discover_interval": "0.5s"}, "templates.tenants.discover_interval", "from 1 second"),
        ({"weight": 0}, "templates.tenants.weight", "whole number >= 1"),
        ({"concurrency_limit": True}, "templates.tenants.concurrency_limit", "not true or false"),
        ({"lanse": 4}, "templates.tenants.lanse", "did you mean 'lanes'?"),
    ],
)
def test_a_bad_template_is_refused_at_start_up(values: Any, field: str, rule: str) -> None:
    error = error_of(**values)
    assert error.field == field
    assert rule in error.rule


def test_a_query_needs_a_catalog_database() -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(templates={"tenants": {"discovery": {"query": "SELECT 'a' AS name"}}})
    assert caught.value.field == "templates.tenants.discovery.dsn"
    assert "is required for a query source" in caught.value.rule
    tenants = template(discovery={"query": "SELECT 'a' AS name"})
    assert tenants.catalog_dsn() == DSN


def test_template_names_and_store_names_cannot_collide() -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(templates={"a.b": {"discovery": {"file": "x.toml"}}})
    assert caught.value.field == "templates.a.b.name"
    with pytest.raises(ConfigurationError) as caught:
        load_settings(
            dsn=DSN,
            stores={"tenants.acme": {}},
            templates={"tenants": {"discovery": {"file": "x.toml"}}},
        )
    assert caught.value.field == "stores.tenants.acme"
    assert "is named like a store of template 'tenants'" in caught.value.rule
    with pytest.raises(ConfigurationError) as caught:
        RelayerSettings(templates={}).template("tenants")
    assert "is not configured (configured templates: none)" in caught.value.rule


def test_worker_weights_may_name_a_templates_store() -> None:
    loaded = load_settings(
        dsn=DSN,
        templates={"tenants": {"discovery": {"file": "x.toml"}}},
        worker={"weights": {"tenants.acme": 3}},
    )
    assert loaded.worker.weights == {"tenants.acme": 3}
    with pytest.raises(ConfigurationError, match="names no configured store"):
        load_settings(dsn=DSN, worker={"weights": {"partners.acme": 3}})


@pytest.mark.parametrize(
    ("row", "field", "value", "rule"),
    [
        (
            DiscoveredRow("acme", schema="Bad-Schema"),
            "stores.tenants.acme.schema",
            "Bad-Schema",
            "plain",
        ),
        (
            DiscoveredRow("acme", table_prefix="x" * 60),
            "stores.tenants.acme.table_prefix",
            "x" * 60,
            "63",
        ),
        (DiscoveredRow("acme", weight=0), "stores.tenants.acme.weight", 0, ">= 1"),
        (DiscoveredRow("acme", weight=1.5), "stores.tenants.acme.weight", 1.5, "whole number"),
        (DiscoveredRow("acme", weight=True), "stores.tenants.acme.weight", True, "true or false"),
        (
            DiscoveredRow("acme", concurrency_limit=2**31),
            "stores.tenants.acme.concurrency_limit",
            2**31,
            "from 1 to 2,147,483,647",
        ),
        (DiscoveredRow("", where="row 2"), "templates.tenants.row 2.name", "", "letters, digits"),
        (DiscoveredRow(7, where="row 3"), "templates.tenants.row 3.name", 7, "letters, digits"),
        (DiscoveredRow("x" * 60), "stores.tenants." + "x" * 60 + ".name", None, "1-63"),
        (DiscoveredRow("acme", dsn="host='x"), "stores.tenants.acme.dsn", "***", "connection"),
    ],
)
def test_a_bad_row_names_the_store_field_value_and_rule(
    row: DiscoveredRow, field: str, value: object, rule: str
) -> None:
    error = row_error(row)
    assert error.field == field
    if value is not None:
        assert error.value == value
    assert rule in error.rule
    assert "\n" not in str(error)


def test_a_row_without_any_dsn_says_where_to_set_one() -> None:
    tenants = TemplateSettings(name="tenants", discovery={"file": "x.toml"})
    with pytest.raises(ConfigurationError) as caught:
        store_from_row(tenants, DiscoveredRow("acme"))
    assert caught.value.field == "stores.tenants.acme.dsn"
    assert "give the row a dsn or set templates.tenants.dsn" in caught.value.rule


def test_the_limit_bound_is_the_queue_tables() -> None:
    assert MAX_CONCURRENCY_LIMIT == MAX_LIMIT


def test_toml_and_json_files_yield_the_same_rows(tmp_path: Path) -> None:
    toml = tmp_path / "stores.toml"
    toml.write_text(
        '[[stores]]\nname = "acme"\nschema = "acme"\nweight = 2\n\n'
        '[[stores]]\nname = "globex"\nfrobnicate = 1\n\n'
        '[[stores]]\nname = "initech"\ndsn = "postgresql://u:pw@h/i"\n'
    )
    rows = [
        {"name": "acme", "schema": "acme", "weight": 2},
        {"name": "globex", "frobnicate": 1},
        {"name": "initech", "dsn": "postgresql://u:pw@h/i"},
    ]
    as_json = tmp_path / "stores.json"
    as_json.write_text(json.dumps(rows))
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"stores": rows}))
    for path in (toml, as_json, wrapped):
        acme, globex, initech = read_file(path)
        assert acme == DiscoveredRow("acme", schema="acme", weight=2, where="row 1")
        assert isinstance(globex, ConfigurationError)
        assert globex.field == "row 2.frobnicate"
        assert "is not a field a discovery row may set" in globex.rule
        assert isinstance(initech, DiscoveredRow) and "pw" not in repr(initech)


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("missing.toml", None, "does not exist; create it"),
        ("broken.toml", "[[stores]\n", "is not valid TOML"),
        ("other.toml", "[stores.acme]\nschema = 'a'\n", "must hold only [[stores]] tables"),
        ("extra.toml", "lanes = 4\n", "must hold only [[stores]] tables"),
        ("broken.json", "[{", "is not valid JSON"),
        ("object.json", '{"acme": {}}', "must hold an array of objects"),
    ],
)
def test_a_file_that_cannot_be_read_says_what_to_fix(
    tmp_path: Path, name: str, text: str | None, words: str
) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(DiscoveryError) as caught:
        read_file(path)
    assert words in str(caught.value)


def test_a_query_is_read_by_column_names() -> None:
    rows = rows_from_columns("tenants", ["name", "schema"], [("acme", "acme"), ("b", None)])
    assert rows == [
        DiscoveredRow("acme", schema="acme", where="row 1"),
        DiscoveredRow("b", where="row 2"),
    ]
    with pytest.raises(DiscoveryError, match="returns column 'tenant_schema'"):
        rows_from_columns("tenants", ["name", "tenant_schema"], [])
    with pytest.raises(DiscoveryError, match="returns no column 'name'"):
        rows_from_columns("tenants", ["schema"], [])


def test_the_environment_sets_templates_and_masks_their_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RELAYER_TEMPLATES__TENANTS__LANES", "8")
    monkeypatch.setenv("RELAYER_TEMPLATES__TENANTS__DISCOVERY__FILE", "stores.json")
    monkeypatch.setenv("RELAYER_CONFIG", "")
    assert load_settings(dsn=DSN).template("tenants").lanes == 8
    monkeypatch.setenv("RELAYER_TEMPLATES__TENANTS__DISCOVERY", "dsn=postgresql://u:pw@h/c")
    with pytest.raises(ConfigurationError) as caught:
        load_settings(dsn=DSN)
    assert "pw" not in str(caught.value)


@pytest.mark.parametrize("module", ["relayer.fleet.templates", "relayer.settings"])
def test_the_settings_and_templates_import_in_either_order(module: str) -> None:
    """A fresh interpreter may ask for either module first (the settings import nothing of
    relayer.fleet)."""
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}; import relayer.fleet.discovery"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_a_row_without_a_name_is_skipped_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "stores.json"
    path.write_text(json.dumps([{"schema": "acme"}, {"name": "good"}]))
    nameless, good = read_file(path)
    assert isinstance(nameless, ConfigurationError)
    assert nameless.field == "row 1.name"
    assert "is required" in nameless.rule
    assert good == DiscoveredRow("good", where="row 2")


def test_rows_are_skipped_as_a_worker_skips_them() -> None:
    tenants = template()
    rows = [
        DiscoveredRow("acme", schema="acme", where="row 1"),
        DiscoveredRow("acme", schema="other", where="row 2"),  # listed twice
        DiscoveredRow("twin", schema="acme", where="row 3"),  # acme's tables
        DiscoveredRow("clash", schema="shop", table_prefix="orders_", where="row 4"),
        DiscoveredRow("globex", schema="globex", where="row 5"),
    ]
    taken = {(DSN, "shop", "orders_"): "orders"}  # a configured store's tables
    found, skipped = validate_rows(tenants, rows, taken)
    assert list(found) == ["tenants.acme", "tenants.globex"]
    assert [(error.field, error.rule) for error in skipped] == [
        ("stores.tenants.acme", "is listed twice (row 2 and before); list each store once"),
        (
            "stores.tenants.twin",
            "uses the same database, schema and table prefix as store 'tenants.acme'; "
            "distinct stores must not share tables",
        ),
        (
            "stores.tenants.clash",
            "uses the same database, schema and table prefix as store 'orders'; distinct "
            "stores must not share tables",
        ),
    ]
