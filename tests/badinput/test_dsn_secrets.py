"""A DSN password with spaces or quotes never shows, in any of its spellings.

libpq accepts a password with spaces quoted (``password='a b'``, ``\\'`` for a quote), with
backslash escapes (``password=a\\ b``) or percent-encoded in a URL; written unquoted, it does not
parse and is refused at start-up. Whatever the form, no part of the password reaches an error, a
repr, a StoreError or a log line.
"""

from __future__ import annotations

import subprocess

import pytest

from relayer.errors import ConfigurationError, StoreError
from relayer.settings import load_settings
from relayer.store.driver import connect
from tests.acceptance.cli import environment
from tests.badinput.support import CliCase, run_cases
from tests.conftest import make_store

FIRST, SECOND = "PGSECRET7781", "PART2SECRET"
WORDS = (FIRST, SECOND)
CLOSED = "host=127.0.0.1 port=1 dbname=shop user=app connect_timeout=2"
# (name, DSN, whether libpq parses it)
DSNS = [
    ("quoted", f"{CLOSED} password='{FIRST} {SECOND}'", True),
    ("quoted-first", f"password='{FIRST} {SECOND}' {CLOSED}", True),
    ("quoted-with-a-quote", f"{CLOSED} password='{FIRST} \\' {SECOND}'", True),
    ("backslash-escaped", f"{CLOSED} password={FIRST}\\ {SECOND}", True),
    ("url", f"postgresql://app:{FIRST}%20{SECOND}@127.0.0.1:1/shop?connect_timeout=2", True),
    (
        "url-query",
        f"postgresql://app@127.0.0.1:1/shop?password={FIRST}%20{SECOND}&connect_timeout=2",
        True,
    ),
    ("unquoted", f"{CLOSED} password={FIRST} {SECOND}", False),
    ("unterminated", f"{CLOSED} password='{FIRST} {SECOND}", False),
    ("double-quoted", f'{CLOSED} password="{FIRST} {SECOND}"', False),
    ("url-with-a-space", f"postgresql://app:{FIRST} {SECOND}@127.0.0.1:1/shop", False),
]
COMMANDS = [
    ("status", "orders"),
    ("schema", "apply", "orders"),
    ("run", "orders"),
    ("parked", "list", "orders"),
    ("queue", "status", "orders"),
    ("--log-format", "json", "run", "orders"),
]


def assert_hidden(text: str) -> None:
    for word in WORDS:
        assert word not in text, text


@pytest.mark.parametrize(("name", "dsn", "parses"), DSNS, ids=[name for name, _, _ in DSNS])
async def test_no_word_of_the_password_shows_in_python(name: str, dsn: str, parses: bool) -> None:
    if not parses:
        with pytest.raises(ConfigurationError) as refused:
            make_store(dsn)
        assert refused.value.value == "***"
        assert_hidden(str(refused.value))
        with pytest.raises(ConfigurationError) as top_level:
            load_settings(dsn=dsn)
        assert_hidden(str(top_level.value))
        return
    store = make_store(dsn)
    assert_hidden(repr(store))
    assert_hidden(repr(load_settings(dsn=dsn, stores={"orders": {}})))
    with pytest.raises(StoreError) as caught:
        await connect(store)
    assert_hidden(str(caught.value))


@pytest.fixture(scope="module")
def cli_results(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, subprocess.CompletedProcess[str]]:
    cases = [
        CliCase(f"{name}:{' '.join(arguments)}", arguments, {"RELAYER_STORES__ORDERS__DSN": dsn})
        for name, dsn, _ in DSNS
        for arguments in COMMANDS
    ]
    return run_cases(cases, tmp_path_factory.mktemp("dsn-secrets"), environment())


@pytest.mark.parametrize(("name", "dsn", "parses"), DSNS, ids=[name for name, _, _ in DSNS])
def test_no_word_of_the_password_shows_on_the_command_line(
    name: str,
    dsn: str,
    parses: bool,
    cli_results: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    for arguments in COMMANDS:
        result = cli_results[f"{name}:{' '.join(arguments)}"]
        output = result.stdout + result.stderr
        assert_hidden(output)
        # Refused at start-up (exit 2), or the database cannot be reached (exit 1).
        assert result.returncode == (1 if parses else 2), output
        assert "Traceback" not in output
