"""``relayer`` under ``opentelemetry-instrument``, the wrapper of opentelemetry-distro.

The wrapper parses its own options (one per OpenTelemetry environment variable) before it runs
the command; ``--config`` used to be "ambiguous" there (relayer/otel_arguments.py).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import psycopg
import pytest

from relayer import Outbox
from relayer.cli import build_parser
from relayer.otel_arguments import GROUP, option_name
from relayer.settings import StoreSettings
from tests.acceptance.cli import environment
from tests.acceptance.test_run_cli import wait_until
from tests.conftest import apply_schema, make_store
from tests.integration.relay.helpers import pending

SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
BIN = Path(sys.executable).parent


def instrument() -> str:
    found = shutil.which("opentelemetry-instrument", path=str(BIN))
    assert found, "opentelemetry-instrument is missing: install the dev extra (make venv)"
    return found


def wrapper_options() -> set[str]:
    """The options opentelemetry-instrument declares, derived from the entry points as it does."""
    return {
        "--" + option_name(name)
        for entry_point in entry_points(group=GROUP)
        for name in dir(entry_point.load())
        if name.startswith("OTEL_")
    }


def relayer_options(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:
        yield from (option for option in action.option_strings if option.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                yield from relayer_options(subparser)


def test_no_relayer_option_is_an_ambiguous_abbreviation_of_the_wrappers() -> None:
    instrument()
    declared = wrapper_options()
    assert "--config" in declared and "--configurator" in declared
    for option in set(relayer_options(build_parser())):
        if option in declared:
            continue  # exact: the command gets it
        longer = sorted(name for name in declared if name.startswith(option))
        assert len(longer) <= 1, f"{option} would be ambiguous: {longer}"


@pytest.fixture
async def memory_store(pg_dsn: str) -> StoreSettings:
    store = make_store(pg_dsn, lanes=4, transports={"memory": {"type": "memory"}})
    await apply_schema(store)
    return store


def config_file(store: StoreSettings, folder: Path) -> Path:
    path = folder / "relayer.toml"
    path.write_text(
        f"""
[stores.orders]
dsn = "{store.require_dsn()}"
lanes = {store.lanes}
table_prefix = "{store.table_prefix}"
lease_duration = "3s"
poll_interval = "0.1s"
default_transport = "memory"

[stores.orders.transports.memory]
type = "memory"
"""
    )
    return path


def traced(*arguments: str, exporter: str = "console") -> list[str]:
    return [
        instrument(),
        "--traces_exporter", exporter, "--metrics_exporter", "none", "--logs_exporter", "none",
        "relayer", *arguments,
    ]  # fmt: skip


def test_schema_print_with_config_runs_under_the_wrapper(
    memory_store: StoreSettings, tmp_path: Path
) -> None:
    config = config_file(memory_store, tmp_path)
    for spelling in (["--config", str(config)], [f"--config={config}"]):
        result = subprocess.run(
            traced(*spelling, "schema", "print", "orders", exporter="none"),
            env=environment(PATH=f"{BIN}:/usr/bin:/bin"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "ambiguous" not in result.stderr
        assert "CREATE TABLE" in result.stdout


def test_run_under_the_wrapper_exports_the_send_span_of_a_traced_row(
    memory_store: StoreSettings, tmp_path: Path
) -> None:
    with psycopg.connect(memory_store.require_dsn()) as conn:
        message_id = Outbox(memory_store).write(
            conn, destination="events", body=b"traced", key="order-1",
            headers={"traceparent": SAMPLED}, transport="memory",
        )  # fmt: skip
        conn.commit()
    process = subprocess.Popen(
        traced("--config", str(config_file(memory_store, tmp_path)), "--log-format", "json",
               "run", "orders"),
        env=environment(PATH=f"{BIN}:/usr/bin:/bin", OTEL_SERVICE_NAME="relayer-test"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: pending(memory_store) == 0, 30)
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    # The console exporter prints each span as a JSON object when the process exits.
    spans = [json.loads(text) for text in re.findall(r"^\{\n.*?^\}$", stdout, re.M | re.S)]
    [send] = [span for span in spans if span["name"] == "send events"]
    assert send["kind"] == "SpanKind.PRODUCER"
    assert send["context"]["trace_id"] == "0x0af7651916cd43dd8448eb211c80319c"
    assert send["parent_id"] == "0xb7ad6b7169203331"
    assert send["attributes"]["messaging.message.id"] == str(message_id)
    assert send["attributes"]["relayer.outcome"] == "sent"
    assert send["resource"]["attributes"]["service.name"] == "relayer-test"
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(line.get("action") == "start" for line in lines), stderr
