"""A connection pooler in front of a store (docs/pgbouncer.md): the rules that make relayer
work through PgBouncer, PgCat or Supavisor in transaction mode.

With ``pooler = "transaction"`` a client owns a server connection only from BEGIN to COMMIT
(or for one autocommit statement), so nothing relayer does may outlive a transaction on the
server: no session ``SET`` (settings travel as ``SET LOCAL`` in the transactions that need
them), no server-side prepared statements (PgBouncer before 1.21 cannot route them), no
``options`` at connect (refused), no LISTEN (it would never fire: it runs on ``listen_dsn``, a
direct connection, or the worker polls). These are the checks and values both modes share.
What they read in a DSN, libpq's parser reads; it also decides whether a DSN parses at all
(the settings' check_dsn asks :func:`dsn_parse_error`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from psycopg.conninfo import conninfo_to_dict
from psycopg.errors import ProgrammingError

from relayer.deadlines import Deadlines

Pooler = Literal["none", "transaction"]
POOLERS: tuple[Pooler, ...] = ("none", "transaction")
POOLER_RULE = (
    "must be 'none' (a direct connection, or a pooler in session mode) or 'transaction' "
    "(PgBouncer, PgCat or Supavisor pooling by transaction)"
)


def check_pooler(value: object) -> object:
    """``pooler``'s value, or a ValueError with the rule (a session-mode pooler is 'none')."""
    if value in POOLERS:
        return value
    raise ValueError(POOLER_RULE)


def dsn_parse_error(dsn: str) -> str | None:
    """Why libpq cannot parse ``dsn`` (its words, which may quote pieces of the DSN, a
    password's among them), or None when it parses. Nothing connects."""
    try:
        conninfo_to_dict(dsn)
    except ProgrammingError as exc:  # a configuration error: no connection is involved
        return str(exc)
    return None


def dsn_sets_options(dsn: str) -> bool:
    """Whether ``dsn`` sets ``options`` (start-up parameters a transaction pooler refuses)."""
    return bool(conninfo_to_dict(dsn).get("options"))


def same_pool(first: str, second: str) -> bool:
    """Whether two DSNs reach the same pool: the same host, port, database and user (a
    pooler's session-mode alias is another database name, or another user)."""
    one, two = conninfo_to_dict(first), conninfo_to_dict(second)
    keys = ("host", "hostaddr", "port", "dbname", "user")
    return all(str(one.get(key) or "") == str(two.get(key) or "") for key in keys)


def idle_timeout(lease: timedelta) -> timedelta:
    """``idle_in_transaction_session_timeout`` of the transactions that hold lane leases or
    claimed rows: a batch ends within half a lease (its deadline), so three quarters of one
    is never reached by a live owner; a silently partitioned owner's backend is ended then,
    freeing the lease row's lock before the lease expires."""
    return timedelta(seconds=Deadlines.of(lease).idle_in_transaction)


def idle_timeout_setting(lease: timedelta) -> str:
    """:func:`idle_timeout` as a PostgreSQL setting value (whole milliseconds)."""
    return f"{max(int(idle_timeout(lease).total_seconds() * 1000), 1)}ms"


def caller_prepare(pooler: Pooler) -> bool | None:
    """psycopg's ``prepare`` for statements relayer runs on a caller's connection (the writer,
    the inbox): never server-side prepared behind a transaction pooler, whatever the
    connection's ``prepare_threshold``; otherwise the connection's choice (None)."""
    return False if pooler == "transaction" else None
