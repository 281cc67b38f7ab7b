"""Every built-in function and catalog relation in relayer's SQL is pg_catalog-qualified.

A schema placed ahead of pg_catalog in the search_path (``evil, pg_catalog, public``) could
otherwise stand in for ``now()`` or ``pg_notify`` inside a worker's or an application's
transaction. tests/acceptance/test_search_path.py shows it against a real database; this test
catches a new unqualified call in any named query before it gets there.
"""

from __future__ import annotations

import re

import pytest

from relayer.operations import schema
from relayer.settings import StoreSettings
from relayer.sql import raw_queries

# Functions and relations relayer's SQL uses (and a few it may use next).
BUILT_INS = [
    "now",
    "count",
    "min",
    "max",
    "sum",
    "unnest",
    "array_length",
    "array_agg",
    "array_to_string",
    "cardinality",
    "power",
    "length",
    "isfinite",
    "bool_or",
    "generate_series",
    "current_database",
    "to_regclass",
    "gen_random_uuid",
    "format_type",
    "pg_notify",
    "pg_advisory_lock",
    "pg_advisory_unlock",
    "pg_advisory_xact_lock",
    "pg_try_advisory_lock",
    "pg_try_advisory_xact_lock",
    "pg_advisory_unlock_all",
    "pg_backend_pid",
    "pg_total_relation_size",
    "pg_get_expr",
    "pg_get_indexdef",
    "pg_get_constraintdef",
    "pg_my_temp_schema",
]
RELATIONS = [
    "pg_locks",
    "pg_database",
    "pg_class",
    "pg_namespace",
    "pg_stat_user_tables",
    "pg_index",
]
_CALL = re.compile(r"(?<![.\w\"])(" + "|".join(BUILT_INS) + r")\s*\(", re.IGNORECASE)
_RELATION = re.compile(r"(?<![.\w\"])(" + "|".join(RELATIONS) + r")\b", re.IGNORECASE)


def code_of(text: str) -> str:
    """``text`` without comments and string literals."""
    lines = [line.partition("--")[0] for line in text.splitlines()]
    return re.sub(r"'(?:[^']|'')*'", "''", "\n".join(lines))


def unqualified(text: str) -> list[str]:
    code = code_of(text)
    return [match[0] for match in (*_CALL.finditer(code), *_RELATION.finditer(code))]


@pytest.mark.parametrize("name", sorted(raw_queries()))
def test_every_named_query_qualifies_its_built_ins(name: str) -> None:
    assert unqualified(raw_queries()[name]) == []


def test_the_drift_check_and_the_printed_script_qualify_theirs() -> None:
    for name in ("catalog_columns", "catalog_indexes", "catalog_constraints", "catalog_schema_oid"):
        assert unqualified(raw_queries()[name]) == []
    script = schema.render(StoreSettings(name="orders"))
    assert script.splitlines()[1] == "SET LOCAL search_path = pg_catalog, pg_temp;"
    before_migrations = script.split("-- migration")[0]
    assert unqualified(before_migrations) == []


def test_the_check_finds_what_it_looks_for() -> None:
    assert unqualified("SELECT now(), count(*) FROM pg_locks -- now()") == [
        "now(",
        "count(",
        "pg_locks",
    ]
    assert unqualified("SELECT pg_catalog.now() FROM pg_catalog.pg_locks WHERE x = 'now()'") == []
