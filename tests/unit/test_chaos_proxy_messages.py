"""How the chaos suite's PostgreSQL proxy classifies a worker's messages: the outcome
statement and the COMMIT after it, whether psycopg sends the COMMIT as a simple query or a
pipeline sends it with the extended protocol (as relayer.store.wire does)."""

from __future__ import annotations

import struct

from tests.chaos.proxy import (
    OUTCOME_MARKER,
    PostgresLink,
    ends_transaction,
    is_commit,
    is_outcome_statement,
)


def message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def query(text: bytes) -> bytes:
    return message(b"Q", text + b"\0")


def parse(name: bytes, text: bytes) -> bytes:
    return message(b"P", name + b"\0" + text + b"\0" + struct.pack("!h", 0))


def bind(statement: bytes) -> bytes:
    return message(b"B", b"\0" + statement + b"\0" + struct.pack("!hhh", 0, 0, 0))


def test_a_commit_is_seen_as_a_simple_query_or_an_unnamed_parse() -> None:
    assert is_commit(ord("Q"), query(b"COMMIT"))
    assert is_commit(ord("P"), parse(b"", b"COMMIT"))
    assert is_commit(ord("P"), parse(b"", b" commit "))
    assert not is_commit(ord("P"), parse(b"relayer_1", b"COMMIT"))  # a prepared statement
    assert not is_commit(ord("P"), parse(b"", b"SELECT 'COMMIT'"))
    assert not is_commit(ord("B"), bind(b""))


def test_a_rollback_ends_the_transaction_too() -> None:
    assert ends_transaction(ord("P"), parse(b"", b"ROLLBACK"))
    assert ends_transaction(ord("Q"), query(b"ROLLBACK"))
    assert not ends_transaction(ord("P"), parse(b"", b"BEGIN"))


def test_a_prepared_outcome_statement_is_seen_at_its_bind() -> None:
    link = PostgresLink()
    text = OUTCOME_MARKER + b"SELECT 1) SELECT 1"
    assert not is_outcome_statement(link, ord("P"), parse(b"relayer_7", text))
    assert is_outcome_statement(link, ord("B"), bind(b"relayer_7"))
    assert not is_outcome_statement(link, ord("B"), bind(b"relayer_8"))
    assert is_outcome_statement(link, ord("P"), parse(b"", text))
