"""What the bad-input suite shares: secrets to watch for, CLI runs in parallel, the catalog.

Every CLI case runs ``relayer`` as a subprocess, as an operator would. Starting Python and
importing relayer costs about half a second, so a table's cases are run a few at a time by one
module-scoped fixture and each parametrized test then reads its own result.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from tests.acceptance.cli import command, environment

# Planted in DSNs and transport options; must never reach a terminal, a log or a parked error.
SECRET = "pl4nted-s3cret-pw"
SASL_SECRET = "pl4nted-sasl-s3cret"
SECRETS = (SECRET, SASL_SECRET)
UNREACHABLE_DSN = f"postgresql://app:{SECRET}@127.0.0.1:1/shop?connect_timeout=2"


@dataclass(frozen=True)
class CliCase:
    """One ``relayer`` invocation: its environment, an optional TOML file, and the arguments."""

    name: str
    arguments: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    toml: str | bytes | None = None  # bytes: written as they are (a file that is not UTF-8)


def run_cases(
    cases: Iterable[CliCase], directory: Path, base_env: Mapping[str, str] | None = None
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run every case (four at a time); the result of each by name."""

    def one(case: CliCase) -> tuple[str, subprocess.CompletedProcess[str]]:
        env = environment(**{**(base_env or {}), **case.env})
        arguments = case.arguments
        if case.toml is not None:
            config = directory / f"{case.name}.toml"
            if isinstance(case.toml, bytes):
                config.write_bytes(case.toml)
            else:
                config.write_text(case.toml)
            arguments = ("--config", str(config), *arguments)
        result = subprocess.run(
            command(*arguments), env=env, capture_output=True, text=True, timeout=60, check=False
        )
        return case.name, result

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, cases))


def error_line(result: subprocess.CompletedProcess[str], status: int = 2) -> str:
    """The single line a refused command printed, after checking its status and output."""
    output = result.stdout + result.stderr
    assert result.returncode == status, output
    for secret in SECRETS:
        assert secret not in output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == "", result.stdout
    return lines[0]


def with_password(dsn: str, password: str = SECRET) -> str:
    """``dsn`` carrying ``password`` (a URL DSN without one; the test servers trust loopback)."""
    if "://" not in dsn:
        return f"{dsn} password={password}"
    parts = urlsplit(dsn)
    if parts.password:
        return dsn
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}:{password}@{host}"))


def secret_of(dsn: str) -> str:
    """The password a DSN carries (planted by ``with_password`` or the server's own)."""
    if "://" in dsn:
        return urlsplit(dsn).password or SECRET
    return SECRET


def catalog(dsn: str) -> dict[str, Any]:
    """Every schema, relation and column outside the system catalogs, and every table's rows."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        system = "nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'"
        schemas = {
            row[0]
            for row in conn.execute(f"SELECT nspname FROM pg_namespace WHERE {system}").fetchall()
        }
        columns = conn.execute(
            "SELECT n.nspname, c.relname, c.relkind, a.attname, format_type(a.atttypid, NULL) "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 "
            f"AND NOT a.attisdropped WHERE {system} ORDER BY 1, 2, 4"
        ).fetchall()
        tables = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables "
            "WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
        rows = {}
        for schema_name, table in tables:
            counted = conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema_name, table))
            ).fetchone()
            rows[f"{schema_name}.{table}"] = counted[0] if counted else None
    return {"schemas": schemas, "columns": columns, "rows": rows}
