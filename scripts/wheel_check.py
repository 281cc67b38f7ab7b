"""Build the sdist and wheel as a clean clone would, install the wheel in a fresh venv, use it.

    python scripts/wheel_check.py          (make wheel-check; make test runs it)

The build sees only the files git tracks (or would track: new files not ignored), so a file
that a developer has locally but the repository lacks fails here, not on a user's machine.
The installed wheel must carry its name, licence and data files, and its ``relayer`` command
must answer ``--version``, ``--help`` and ``schema print``. Exits 1 with the reason otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = "relayer-outbox"
WHEEL_PREFIX = "relayer_outbox-"
# Files the wheel must contain beyond the Python modules (package data and the licence).
WHEEL_FILES = ("relayer/py.typed", "relayer/sql/relay.sql", "relayer/migrations/0001_initial.sql")


class CheckFailed(Exception):
    pass


def run(command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=600
    )
    if result.returncode != 0:
        raise CheckFailed(
            f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}{result.stderr}"
        )
    return result.stdout


def copy_clone(destination: Path) -> None:
    """The working tree's tracked and new, not ignored, files: what a clone would hold."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.is_file():  # deleted in the working tree, not yet committed
            continue
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(source.stat().st_mode)


def check_archives(dist: Path) -> Path:
    wheels = sorted(dist.glob(f"{WHEEL_PREFIX}*.whl"))
    sdists = sorted(dist.glob(f"{WHEEL_PREFIX}*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise CheckFailed(f"expected one wheel and one sdist named {WHEEL_PREFIX}*, got {dist}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
        missing = [name for name in WHEEL_FILES if name not in names]
        if not any(name.endswith(".dist-info/licenses/LICENSE") for name in names):
            missing.append("*.dist-info/licenses/LICENSE")
        if missing:
            raise CheckFailed(f"the wheel lacks {', '.join(missing)}")
        metadata = wheel.read(
            next(name for name in names if name.endswith(".dist-info/METADATA"))
        ).decode()
    expected = (f"Name: {DISTRIBUTION}\n", "License-Expression: Apache-2.0\n")
    for line in expected:
        if line not in metadata:
            raise CheckFailed(f"the wheel's METADATA lacks {line.strip()!r}")
    with tarfile.open(sdists[0]) as sdist:
        if not any(name.endswith("/LICENSE") for name in sdist.getnames()):
            raise CheckFailed("the sdist lacks LICENSE")
    return wheels[0]


def check_installed(wheel: Path, work: Path) -> None:
    venv = work / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python, relayer = str(venv / "bin" / "python"), str(venv / "bin" / "relayer")
    run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)])
    # Outside the source tree, so the import comes from the installed wheel.
    env = {key: value for key, value in os.environ.items() if not key.startswith("RELAYER_")}
    env["RELAYER_STORES__ORDERS__SCHEMA"] = "messaging"
    version = run(
        [python, "-c", "import importlib.metadata as m; print(m.version('relayer-outbox'))"],
        cwd=work,
        env=env,
    ).strip()
    from_package = run(
        [python, "-c", "import relayer; print(relayer.__version__, relayer.__file__)"],
        cwd=work,
        env=env,
    ).split()
    if from_package[0] != version or not from_package[1].startswith(str(venv)):
        raise CheckFailed(f"relayer imported as {from_package}, distribution version {version}")
    if run([relayer, "--version"], cwd=work, env=env).strip() != f"relayer {version}":
        raise CheckFailed("relayer --version does not print the distribution's version")
    if "schema" not in run([relayer, "--help"], cwd=work, env=env):
        raise CheckFailed("relayer --help does not list the schema command")
    ddl = run([relayer, "schema", "print", "orders"], cwd=work, env=env)
    if 'CREATE TABLE "messaging"."relayer_outbox"' not in ddl:
        raise CheckFailed("relayer schema print orders printed no outbox table")


def main() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="relayer-wheel-check-") as folder:
        work = Path(folder)
        source = work / "source"
        copy_clone(source)
        try:
            run([sys.executable, "-m", "build", "--outdir", str(work / "dist"), str(source)])
            wheel = check_archives(work / "dist")
            check_installed(wheel, work)
        except CheckFailed as exc:
            print(f"wheel check failed: {exc}", file=sys.stderr)
            return 1
    print(
        f"wheel check: {wheel.name} builds from a clean tree, installs in a fresh venv and "
        f"runs relayer --version, --help and schema print ({time.monotonic() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
