"""``relayer dashboard --template``: its option and variable, refusals at start-up with one line
(exit 2), and a dashboard process whose Fleet page lists a template's stores."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

from relayer.fleet.templates import DiscoveredRow, store_from_row
from relayer.settings import TemplateSettings, load_settings
from tests.acceptance.cli import command, environment, relayer
from tests.conftest import apply_schema
from tests.examples.documented import ROOT, documented


def configured(dsn: str, tmp_path: Path) -> tuple[dict[str, str], Path]:
    source = tmp_path / "tenants.json"
    source.write_text(json.dumps([{"name": "acme", "table_prefix": "acme_"}]))
    config = tmp_path / "relayer.toml"
    config.write_text(
        f"dsn = {json.dumps(dsn)}\n"
        "[templates.tenants]\nlanes = 4\n"
        f"[templates.tenants.discovery]\nfile = {json.dumps(str(source))}\n"
    )
    return environment(RELAYER_CONFIG=str(config)), source


def test_bad_template_arguments_stop_the_dashboard_with_one_line(tmp_path: Path) -> None:
    env, _ = configured("postgresql://user@127.0.0.1:1/db", tmp_path)
    cases = {
        "unknown": (
            ["--template", "partners"],
            {},
            "relayer: error: template: 'partners' is invalid: is not configured (configured "
            "templates: 'tenants'); add a [templates.partners] section with its "
            "[templates.partners.discovery] source to the config file (docs/fleet.md)",
        ),
        "unknown, from the environment": (
            [],
            {"RELAYER_DASHBOARD_TEMPLATE": "tenants,partners"},
            "relayer: error: template: 'partners' is invalid: is not configured",
        ),
        "not a name": (
            ["--template", "no such"],
            {},
            "relayer: error: template: 'no such' is invalid: a template name is 1-41 characters",
        ),
        "no name in the variable": (
            [],
            {"RELAYER_DASHBOARD_TEMPLATE": " , "},
            "relayer: error: RELAYER_DASHBOARD_TEMPLATE: ' , ' names no template (NAME or "
            "NAME,NAME) (it stands for --template); fix it or unset it",
        ),
        "neither stores nor templates": (
            [],
            {},
            "relayer: error: dashboard: which stores? give STORE names, or --template NAME "
            "(RELAYER_DASHBOARD_TEMPLATE)",
        ),
    }
    for case, (arguments, variables, expected) in cases.items():
        result = relayer("dashboard", "--port", "0", *arguments, env={**env, **variables})
        assert result.returncode == 2, (case, result.stderr)
        assert result.stderr.startswith(expected), case
        assert len(result.stderr.strip().splitlines()) == 1, (case, result.stderr)
    given = relayer("dashboard", "--template", ",", env=env)
    assert given.returncode == 2  # argparse: the usage, then the rule
    assert "argument --template: ',' names no template (NAME or NAME,NAME)" in given.stderr


def test_a_dashboard_with_a_template_lists_its_stores(pg_dsn: str, tmp_path: Path) -> None:
    documented(ROOT / "docs/fleet.md", "relayer dashboard --template tenants")
    env, _ = configured(pg_dsn, tmp_path)
    template: TemplateSettings = load_settings(
        dsn=pg_dsn, templates={"tenants": {"lanes": 4, "discovery": {"file": "x.json"}}}
    ).template("tenants")
    row = DiscoveredRow("acme", table_prefix="acme_", where="test")
    asyncio.run(apply_schema(store_from_row(template, row).settings))
    process = subprocess.Popen(
        command("--log-level", "INFO", "dashboard", "--template", "tenants", "--port", "0"),
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()  # the first line says where it listens
        found = re.search(r"dashboard for the stores of template tenants on (http://\S+/) ", line)
        assert found, line + process.stderr.read()
        with urllib.request.urlopen(f"{found[1]}fleet", timeout=30) as response:
            fleet = response.read().decode()
        with urllib.request.urlopen(f"{found[1]}s/tenants.acme/overview", timeout=30) as response:
            overview = response.read().decode()
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert "Traceback" not in stderr, stderr
    assert re.findall(r'<tr data-store="([^"]+)">', fleet) == ["tenants.acme"]
    assert 'aria-current="page">tenants.acme</a>' in overview
