"""docs/fleet.md as written: its configuration loads, its source files and query yield the
stores it says, and the warning it shows for a bad row is the one a refresh logs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from relayer.fleet.discovery import Fleet
from relayer.fleet.sources import Row, read_file
from relayer.fleet.templates import DiscoveredRow, store_from_row
from relayer.settings import TemplateSettings, load_settings
from relayer.worker import Worker
from tests.examples.documented import ROOT, code_block

FLEET = ROOT / "docs/fleet.md"


def documented_template(tmp_path: Path, config: str | None = None) -> TemplateSettings:
    path = tmp_path / "relayer.toml"
    path.write_text(config or code_block(FLEET, "toml", "[templates.tenants]"))
    return load_settings(path).template("tenants")


def test_the_documented_configuration_and_files_yield_the_documented_stores(
    tmp_path: Path,
) -> None:
    tenants = documented_template(tmp_path)
    assert tenants.discovery.file == Path("tenants.toml")
    assert (tenants.lanes, tenants.table_prefix, tenants.default_transport) == (
        16,
        "outbox_",
        "kafka",
    )
    (tmp_path / "tenants.toml").write_text(code_block(FLEET, "toml", "[[stores]]"))
    (tmp_path / "tenants.json").write_text(code_block(FLEET, "json", '"name": "acme"'))
    acme, globex = (
        store_from_row(tenants, row)
        for row in read_file(tmp_path / "tenants.toml")
        if isinstance(row, DiscoveredRow)
    )
    assert (acme.name, acme.settings.db_schema, acme.weight) == ("tenants.acme", "acme", 3)
    assert (globex.name, globex.concurrency_limit) == ("tenants.globex", 4)
    _, initech = (
        store_from_row(tenants, row)
        for row in read_file(tmp_path / "tenants.json")
        if isinstance(row, DiscoveredRow)
    )
    assert initech.settings.dsn == "postgresql://relayer@db2.internal/initech"
    assert initech.settings.table_prefix == "outbox_"

    query = code_block(FLEET, "toml", "query =")
    config = code_block(FLEET, "toml", "[templates.tenants]")
    with_query = config.replace('[templates.tenants.discovery]\nfile = "tenants.toml"\n', query)
    assert with_query != config
    catalog = documented_template(tmp_path, with_query)
    assert catalog.discovery.query is not None and catalog.discovery.query.startswith("SELECT")
    assert catalog.catalog_dsn() == "postgresql://relayer@control.internal/catalog"


async def test_the_documented_warning_is_what_a_refresh_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tenants = documented_template(tmp_path)
    shown = next(
        line
        for line in FLEET.read_text().splitlines()
        if line.startswith("template tenants: skipping")
    )

    async def read(_: TemplateSettings) -> list[Row]:
        return [DiscoveredRow("bad", schema="Bad-Schema", where="row 1")]

    caplog.set_level(logging.WARNING, logger="relayer.fleet.discovery")
    fleet = Fleet(Worker([]), [tenants], reader=read)
    report = await fleet.refresh("tenants")
    assert report.read and report.found == 0
    assert [record.getMessage() for record in caplog.records] == [shown]
