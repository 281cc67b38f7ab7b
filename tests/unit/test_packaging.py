"""The package's metadata: its PyPI name, licence, version source and README links.

`make wheel-check` builds and installs the wheel; these checks are the fast part.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import relayer
from relayer.errors import DISTRIBUTION, install_command

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Markdown links and images: [text](target)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_distribution_is_named_relayer_outbox_everywhere() -> None:
    # "relayer" on PyPI is an unrelated project.
    assert PROJECT["name"] == DISTRIBUTION == "relayer-outbox"
    assert install_command("kafka") == "pip install 'relayer-outbox[kafka]'"
    plugin = tomllib.loads((ROOT / "examples/plugin_transport/pyproject.toml").read_text())
    assert plugin["project"]["dependencies"] == ["relayer-outbox"]
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    assert "pip install" in dockerfile
    documents = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *ROOT.glob("examples/*/*.md")]
    for document in documents:
        text = document.read_text()
        assert not re.search(r"pip install\s+['\"]?relayer\[", text), document
        assert "extra `relayer[" not in text, document


def test_licence_is_an_spdx_expression_with_its_file() -> None:
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert not any(c.startswith("License ::") for c in PROJECT["classifiers"])
    assert any(c.startswith("Development Status ::") for c in PROJECT["classifiers"])


def test_the_version_is_written_once_in_the_package() -> None:
    assert PROJECT["dynamic"] == ["version"]
    assert "version" not in PROJECT
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["dynamic"]["version"] == {"attr": "relayer.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", relayer.__version__)


def test_project_urls_name_source_issues_changelog_and_documentation() -> None:
    assert set(PROJECT["urls"]) >= {"Source", "Issues", "Changelog", "Documentation"}
    assert all(url.startswith("https://") for url in PROJECT["urls"].values())


def test_readme_links_are_absolute_so_they_work_on_pypi() -> None:
    targets = LINK.findall((ROOT / "README.md").read_text())
    assert targets
    relative = [target for target in targets if not target.startswith(("https://", "#"))]
    assert relative == []
