"""docker/requirements.lock, what the container image installs, is in step with pyproject.toml:
every dependency relayer declares (with the extras the image installs, and the build backend)
is pinned there at a version its specifier allows, nothing is pinned for relayer that it no
longer declares, and every pin carries its hashes (pip --require-hashes). Out of step: run
scripts/lock_image.sh."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "docker/requirements.lock"
FIX = "out of step with pyproject.toml: run scripts/lock_image.sh"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def pins() -> dict[str, tuple[Version, str]]:
    """Each pinned package: its version and its whole entry (hashes and ``# via`` lines)."""
    found: dict[str, tuple[Version, str]] = {}
    name = ""
    for line in LOCK.read_text().splitlines():
        match = _PIN.match(line)
        if match:
            name = canonicalize_name(match.group(1))
            found[name] = (Version(match.group(2)), line + "\n")
        elif name and line.startswith(" "):
            version, entry = found[name]
            found[name] = (version, entry + line + "\n")
    return found


def declared() -> list[Requirement]:
    """What the image asks for: relayer's dependencies, those of the extras the lock script
    installs, and pyproject's build requirements."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    extras = re.findall(r"--extra (\w+)", (ROOT / "scripts/lock_image.sh").read_text())
    assert extras, "scripts/lock_image.sh names no extra"
    texts = list(project["dependencies"]) + list(pyproject["build-system"]["requires"])
    for extra in extras:
        texts += project["optional-dependencies"][extra]
    return [Requirement(text) for text in texts]


def test_every_declared_dependency_is_pinned_within_its_specifier() -> None:
    pinned = pins()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} is not in docker/requirements.lock: {FIX}"
        version = pinned[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"docker/requirements.lock pins {name}=={version}, outside {requirement}: {FIX}"
        )
        for extra in requirement.extras:  # psycopg[binary,pool]: the extra's package too
            wanted = canonicalize_name(f"{name}-{extra}")
            assert wanted in pinned, f"{wanted} ({requirement}) is not locked: {FIX}"


def test_nothing_is_pinned_for_relayer_that_it_no_longer_declares() -> None:
    names = {canonicalize_name(requirement.name) for requirement in declared()}
    for name, (_, entry) in pins().items():
        vias = re.findall(r"#(?: via)?\s+(.+)$", entry, re.MULTILINE)
        direct_only = vias and all(
            "(pyproject.toml)" in via or "build-requirements.in" in via for via in vias
        )
        if direct_only:
            assert name in names, f"{name} is locked for relayer, which no longer needs it: {FIX}"


def test_every_pin_carries_its_hashes() -> None:
    for name, (_, entry) in pins().items():
        assert "--hash=sha256:" in entry, f"{name} has no hash in docker/requirements.lock"
