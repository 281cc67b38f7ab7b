"""``relayer completion bash|zsh|fish``: each script, sourced in its shell, completes commands,
options, choices and the configured store names. zsh and fish are tested where installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.cli import environment, relayer
from tests.services import unavailable

CONFIG = (
    '[stores.orders]\ndsn = "postgresql://user@127.0.0.1:1/db"\n'
    '[stores.billing]\ndsn = "postgresql://user@127.0.0.1:1/db"\ntable_prefix = "billing_"\n'
    '[templates.tenants.discovery]\nfile = "tenants.toml"\n'
)
# (the words typed, the last one being completed; what bash offers)
BASH_CASES = [
    (
        ["relayer", ""],
        "schema run status parked queue partitions dashboard demo dev completion",
    ),
    (["relayer", "schema", ""], "print sql apply check grants"),
    (["relayer", "--config", "{config}", "schema", "sql", "o"], "orders"),
    (["relayer", "parked", ""], "list redrive drop"),
    (["relayer", "partitions", ""], "rotate"),
    (["relayer", "--config", "{config}", "partitions", "rotate", "b"], "billing"),
    (["relayer", "status", "--"], "--help --all --json --check --max-lag"),
    (["relayer", "--log-level", ""], "DEBUG INFO WARNING ERROR"),
    (["relayer", "schema", "grants", "orders", "--for", "w"], "writer worker"),
    (["relayer", "completion", ""], "bash zsh fish"),
    (["relayer", "run", "orders", "--metrics-port", ""], ""),  # a port: nothing to offer
    (["relayer", "--config", "{config}", "status", ""], "orders billing"),
    (["relayer", "--config", "{config}", "run", "orders", "b"], "billing"),
    (["relayer", "--config", "{config}", "run", "--template", ""], "tenants"),
    (["relayer", "--config", "{config}", "dashboard", "--template", ""], "tenants"),
    (["relayer", "--config", "{config}", "dashboard", "o"], "orders"),
]


def shell_environment() -> dict[str, str]:
    """Without RELAYER_ settings, with this interpreter's `relayer` first on PATH."""
    env = environment()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def script(shell: str) -> str:
    result = relayer("completion", shell, env=environment())
    assert result.returncode == 0 and not result.stderr, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "relayer.toml"
    path.write_text(CONFIG)
    return path


def test_bash_completes_commands_options_choices_and_store_names(
    config: Path, tmp_path: Path
) -> None:
    (tmp_path / "relayer.bash").write_text(script("bash"))
    lines = [f"source {tmp_path / 'relayer.bash'}", "complete -p relayer"]
    for words, _ in BASH_CASES:
        quoted = " ".join(f"'{word.format(config=config)}'" for word in words)
        lines += [
            f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _relayer",
            'echo "${COMPREPLY[*]}"',
        ]
    result = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", "\n".join(lines)],
        capture_output=True,
        text=True,
        env=shell_environment(),
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    registered, *offered = result.stdout.split("\n")[: len(BASH_CASES) + 1]
    assert registered == "complete -F _relayer relayer"
    assert offered == [expected for _, expected in BASH_CASES]


def test_fish_completes_commands_options_and_store_names(config: Path) -> None:
    if shutil.which("fish") is None:
        unavailable("fish is not installed")
    commands = [
        "relayer completion fish | source",
        'complete -C "relayer parked "',
        'complete -C "relayer status --"',
        f'complete -C "relayer --config {config} status "',
        f'complete -C "relayer --config {config} partitions rotate "',
    ]
    result = subprocess.run(
        ["fish", "--no-config", "-c", "; echo ---; ".join(commands)],
        capture_output=True,
        text=True,
        env=shell_environment(),
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    _, parked, status, stores, rotated = [
        [line.split("\t")[0] for line in part.strip().splitlines()]
        for part in ("\n" + result.stdout).split("---")
    ]
    assert parked == ["drop", "list", "redrive"]
    assert {"--json", "--check", "--max-lag"} <= set(status)
    assert stores == ["billing", "orders"]
    assert rotated == ["billing", "orders"]


def test_zsh_registers_the_completion(config: Path) -> None:
    if shutil.which("zsh") is None:
        unavailable("zsh is not installed")
    result = subprocess.run(
        [
            "zsh",
            "-f",
            "-c",
            "autoload -U compinit && compinit -u; source <(relayer completion zsh); "
            "print -r -- $_comps[relayer]",
        ],
        capture_output=True,
        text=True,
        env=shell_environment(),
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "_bash_complete -F _relayer"


def test_completion_needs_no_configuration_and_names_the_shells() -> None:
    broken = environment(RELAYER_LOG_LEVEL="LOUD")  # settings that would not load
    assert relayer("completion", "bash", env=broken).returncode == 0
    missing = relayer("completion", env=environment())
    assert missing.returncode == 2
    assert "`relayer completion bash`, `zsh` or `fish`" in missing.stderr
