"""Log lines: JSON or text, the structured fields, never a secret, a documented vocabulary."""

from __future__ import annotations

import ast
import json
import logging
import re
import sys
from pathlib import Path

import pytest

from relayer.observability.logs import (
    JsonFormatter,
    RedactingFilter,
    TextFormatter,
    configure,
    scrub,
)

ROOT = Path(__file__).resolve().parents[2]
SECRETS = ("pg-secret-1", "sasl-secret-2", "token-secret-3")


def emit(formatter: logging.Formatter, *args: object, **extra: object) -> str:
    """Format one WARNING record the way the CLI's handler does."""
    record = logging.LogRecord("relayer.test", logging.WARNING, __file__, 1, *args, None)
    for name, value in extra.items():
        setattr(record, name, value)
    assert RedactingFilter().filter(record)
    return formatter.format(record)


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()], ids=["json", "text"])
def test_secrets_in_messages_fields_and_reprs_are_masked(formatter: logging.Formatter) -> None:
    config = {"bootstrap.servers": "127.0.0.1:9092", "sasl.password": "sasl-secret-2"}
    line = emit(
        formatter,
        "store %s: cannot connect to %s with %r",
        ("orders", "postgresql://relayer:pg-secret-1@db:5432/app", config),
        action="transport_error",
        store="orders",
        error=ValueError("auth failed, token: token-secret-3"),
    )
    assert not any(secret in line for secret in SECRETS), line
    assert "postgresql://relayer:***@db:5432/app" in line
    assert "'sasl.password': '***'" in line and "127.0.0.1:9092" in line


def test_json_lines_carry_the_structured_fields() -> None:
    line = emit(JsonFormatter(), "key %r parked", ("order-7",), action="park", lane=3, key="k")
    entry = json.loads(line)
    assert entry["level"] == "WARNING" and entry["logger"] == "relayer.test"
    assert entry["message"] == "key 'order-7' parked"
    assert (entry["action"], entry["lane"], entry["key"]) == ("park", 3, "k")
    assert "store" not in entry  # absent fields are left out, not null


def test_tracebacks_are_masked_too() -> None:
    try:
        raise RuntimeError("connect failed: password=pg-secret-1")
    except RuntimeError:
        record = logging.LogRecord(
            "relayer.test", logging.ERROR, __file__, 1, "boom", None, exc_info=True
        )
        record.exc_info = sys.exc_info()
    RedactingFilter().filter(record)
    for formatter in (JsonFormatter(), TextFormatter()):
        text = formatter.format(record)
        assert "pg-secret-1" not in text and "password=***" in text


def test_configure_writes_json_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogger("relayer").level)
    try:
        configure("DEBUG", "json")
        logging.getLogger("relayer.worker").debug(
            "dsn %s", "host=db password=pg-secret-1", extra={"action": "start"}
        )
        logging.getLogger("other.library").info("not shown: other loggers log WARNING and up")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
        logging.getLogger("relayer").setLevel(saved[2])
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["message"] == "dsn host=db password=***"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ('{"password": "a\\"b"}', '{"password": "***"}'),
        ("('sasl.password', 'x')", "('sasl.password', '***')"),
        ("{'sasl.username': 'u'}", "{'sasl.username': 'u'}"),
        ("amqp://guest:guest@127.0.0.1/", "amqp://guest:***@127.0.0.1/"),
        ("lane 3: 500 rows", "lane 3: 500 rows"),
    ],
)
def test_scrub(text: str, shown: str) -> None:
    assert scrub(text) == shown


def emitted_actions() -> dict[str, str]:
    """Every literal ``"action": "..."`` in the package's logging extras -> where."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "relayer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if (
                        isinstance(key, ast.Constant)
                        and key.value == "action"
                        and isinstance(value, ast.Constant)
                        and isinstance(value.value, str)
                    ):
                        found[value.value] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def test_every_emitted_action_is_documented() -> None:
    docs = (ROOT / "docs" / "observability.md").read_text("utf-8")
    documented = set(re.findall(r"^\| `([a-z_-]+)` \| [A-Z]+ \|", docs, re.MULTILINE))
    emitted = emitted_actions()
    assert len(emitted) > 20
    missing = {action: where for action, where in emitted.items() if action not in documented}
    assert not missing, f"add these actions to docs/observability.md: {missing}"
