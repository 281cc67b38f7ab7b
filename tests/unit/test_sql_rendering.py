"""How named queries are rendered for a store: short enough for psycopg's parse cache."""

from __future__ import annotations

import pytest
from psycopg import _queries, sql

from relayer.identifiers import LONGEST_SUFFIX, POSTGRES_NAME_LIMIT, StoreNames
from relayer.sql import RUNTIME_IDENTIFIERS, compose_with, queries_for, raw_queries

# The longest names a store can have (schema and prefix at their validated maximum length).
LONG_NAMES = StoreNames.create(
    "s" * POSTGRES_NAME_LIMIT, "p" * (POSTGRES_NAME_LIMIT - len(LONGEST_SUFFIX))
)


@pytest.mark.parametrize("name", sorted(raw_queries()))
def test_every_query_is_short_enough_for_psycopgs_parse_cache(name: str) -> None:
    # psycopg parses a statement's placeholders again on every execution when the statement is
    # longer than this: the relay's outcome statement once cost more Python time per batch in
    # that parse than in its round trip.
    if name in RUNTIME_IDENTIFIERS:  # a table named when it runs: the longest name there is
        longest = sql.Identifier("s" * POSTGRES_NAME_LIMIT, "t" * POSTGRES_NAME_LIMIT)
        tables = dict.fromkeys(RUNTIME_IDENTIFIERS[name], longest)
        rendered = compose_with(name, LONG_NAMES, **tables).as_string(None)
    else:
        rendered = queries_for(LONG_NAMES)[name]
    assert len(rendered.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH, name


def test_comment_lines_are_left_out_and_the_sql_kept() -> None:
    template = raw_queries()["record_outcomes"]
    rendered = queries_for(LONG_NAMES)["record_outcomes"]
    assert any(line.lstrip().startswith("--") for line in template.splitlines())
    assert not any(line.lstrip().startswith("--") for line in rendered.splitlines())
    assert "WITH fence AS (" in rendered
