"""The database-side records of a chaos run, in either storage mode (docs/storage.md), and
their readers.

- ``chaos_written``: the writer records each row's id, key, sequence number and lane in the
  transaction that writes it (and, by default, that transaction's id): the committed set is
  exactly that table, even when the writer lost its connection during a COMMIT.
- Delete mode: an ``AFTER DELETE`` trigger on the outbox records each committed delete and
  whether the deleting transaction held the lane's lease row (I5, tests/chaos/checker.py).
- Partitioned mode: sent rows stay in the outbox; a row leaves the pending set when its lane's
  progress advances past it (and it is not copied into the held table), or when it is deleted
  from the held table. A trigger on the progress table records each change of a lane's
  progress (the lane, the old and new ``done_id``, whether the changing transaction held the
  lane's lease row, and its snapshot), one on the held table records each row copied into it
  (by an advance, or by rotation before it drops a partition), and the delete trigger records
  each row deleted from it. A row is *removed* once for each advance whose range holds it,
  minus once if it was copied into the held table, plus once for its delete from there.
- Both modes: a trigger on the parked table records every park (tests/chaos/test_stall.py).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import psycopg
from psycopg import sql

from relayer.settings import StoreSettings
from relayer.store.status import read_summary
from tests.chaos.checker import Audit, Written
from tests.chaos.proxy import LoopThread

_LEASE_MINE = """
    coalesce(l.xmin = pg_current_xact_id()::xid OR l.xmax = pg_current_xact_id()::xid, false),
    coalesce(l.expires_at > clock_timestamp(), false)
"""

_AUDIT_SQL = """
CREATE TABLE chaos_written (
    id uuid PRIMARY KEY, key text NOT NULL, seq int NOT NULL, lane int NOT NULL,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id()
);
CREATE TABLE chaos_deletes (
    id uuid NOT NULL, lane int, client_port int, lease_owner text, lease_mine bool,
    lease_live bool, attempts int, at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE chaos_parks (
    key text NOT NULL, attempts int, waits_for_operator bool, error text,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION chaos_audit_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_deletes (id, lane, client_port, lease_owner, lease_mine, lease_live,
                               attempts)
    SELECT OLD.id, OLD.lane, inet_client_port(), l.owner, {lease_mine}, OLD.attempts
    FROM (SELECT 1) AS one
    LEFT JOIN {leases} AS l ON l.lane = OLD.lane;
    RETURN OLD;
END
$$;
CREATE TRIGGER chaos_audit AFTER DELETE ON {outbox}
    FOR EACH ROW EXECUTE FUNCTION chaos_audit_delete();
CREATE FUNCTION chaos_audit_park() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_parks (key, attempts, waits_for_operator, error)
    VALUES (NEW.ordering_key, NEW.attempts, NEW.retry_at IS NULL, NEW.last_error);
    RETURN NEW;
END
$$;
CREATE TRIGGER chaos_audit_park AFTER INSERT OR UPDATE ON {parked}
    FOR EACH ROW EXECUTE FUNCTION chaos_audit_park();
"""

_PARTITIONED_AUDIT_SQL = """
CREATE TABLE chaos_advances (
    lane int NOT NULL, old_id uuid NOT NULL, new_id uuid NOT NULL, lease_owner text,
    lease_mine bool, lease_live bool, snapshot pg_snapshot NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE chaos_held (
    id uuid NOT NULL, lane int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION chaos_audit_advance() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_advances (lane, old_id, new_id, lease_owner, lease_mine, lease_live,
                                snapshot)
    SELECT NEW.lane, OLD.done_id, NEW.done_id, l.owner, {lease_mine}, pg_current_snapshot()
    FROM (SELECT 1) AS one
    LEFT JOIN {leases} AS l ON l.lane = NEW.lane;
    RETURN NEW;
END
$$;
CREATE TRIGGER chaos_audit_advance AFTER UPDATE ON {progress}
    FOR EACH ROW EXECUTE FUNCTION chaos_audit_advance();
CREATE FUNCTION chaos_audit_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO chaos_held (id, lane) VALUES (NEW.id, NEW.lane);
    RETURN NEW;
END
$$;
CREATE TRIGGER chaos_audit_hold AFTER INSERT ON {held}
    FOR EACH ROW EXECUTE FUNCTION chaos_audit_hold();
CREATE TRIGGER chaos_audit_held_delete AFTER DELETE ON {held}
    FOR EACH ROW EXECUTE FUNCTION chaos_audit_delete();
"""


def _table(store: StoreSettings, name: str) -> sql.Identifier:
    return sql.Identifier(store.names.table(name))


def install_audit(store: StoreSettings) -> None:
    template = _AUDIT_SQL
    if store.storage == "partitioned":
        template += _PARTITIONED_AUDIT_SQL
    statement = sql.SQL(template).format(
        lease_mine=sql.SQL(_LEASE_MINE),
        leases=_table(store, "leases"),
        outbox=_table(store, "outbox"),
        parked=_table(store, "parked"),
        progress=_table(store, "progress"),
        held=_table(store, "held"),
    )
    with psycopg.connect(store.require_dsn(), autocommit=True) as conn:
        conn.execute(statement)


def read_written(store: StoreSettings) -> dict[uuid.UUID, Written]:
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute("SELECT id, key, seq FROM chaos_written ORDER BY id").fetchall()
    return {row[0]: Written(row[1], row[2]) for row in rows}


_REMOVALS = {
    "delete": "SELECT count(*), count(*) FILTER (WHERE NOT lease_mine) FROM chaos_deletes",
    "partitioned": """
        SELECT (SELECT count(*) FROM chaos_written AS w JOIN chaos_advances AS a
                ON a.lane = w.lane AND w.id > a.old_id AND w.id <= a.new_id)
               - (SELECT count(*) FROM chaos_held) + (SELECT count(*) FROM chaos_deletes),
               (SELECT count(*) FILTER (WHERE NOT lease_mine) FROM chaos_advances)
               + (SELECT count(*) FILTER (WHERE NOT lease_mine) FROM chaos_deletes)
    """,
}


def read_audit(store: StoreSettings) -> Audit:
    """The rows removed from the pending set, and the removals made without the lane's lease
    row (delete mode: deletes; partitioned mode: see the module docstring)."""
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(_REMOVALS[store.storage]).fetchone()
    assert row is not None
    return Audit(int(row[0]), int(row[1]))


@dataclass(frozen=True, slots=True)
class Counted:
    """What the relay counted against rows and keys in a run (from the audit tables)."""

    attempted_rows: int  # rows (sent or pending) with at least one attempt counted
    most_attempts: int
    parked_keys: int  # distinct keys ever parked
    operator_keys: int  # distinct keys that ever waited for an operator (retry_at NULL)
    errors: tuple[str, ...]  # the most frequent park errors, a few


def read_counted(store: StoreSettings) -> Counted:
    # Attempts are counted on outbox rows in delete mode, on held rows in partitioned mode.
    counted_on = _table(store, "held" if store.storage == "partitioned" else "outbox")
    with psycopg.connect(store.require_dsn()) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT count(*) FILTER (WHERE attempts > 0), coalesce(max(attempts), 0) "
                "FROM (SELECT attempts FROM chaos_deletes UNION ALL SELECT attempts FROM {}) a"
            ).format(counted_on)
        ).fetchone()
        parks = conn.execute(
            "SELECT count(DISTINCT key), count(DISTINCT key) FILTER (WHERE waits_for_operator) "
            "FROM chaos_parks"
        ).fetchone()
        errors = conn.execute(
            "SELECT left(error, 300) FROM chaos_parks GROUP BY 1 ORDER BY count(*) DESC LIMIT 3"
        ).fetchall()
    assert row is not None and parks is not None
    return Counted(
        int(row[0]), int(row[1]), int(parks[0]), int(parks[1]), tuple(e[0] for e in errors)
    )


def removals_of(store: StoreSettings, ids: list[str]) -> list[str]:
    """How the audit saw rows leave the pending set (for lost rows: who deleted them, or which
    advance passed them, when, holding what)."""
    with psycopg.connect(store.require_dsn()) as conn:
        rows = conn.execute(
            "SELECT id, lane, lease_owner, lease_mine, lease_live, at FROM chaos_deletes "
            "WHERE id = ANY(%s::uuid[]) ORDER BY at",
            (ids,),
        ).fetchall()
        found = [
            f"{row[0]} lane {row[1]} deleted by {row[2]} (mine {row[3]}, live {row[4]}) at {row[5]}"
            for row in rows
        ]
        if store.storage == "partitioned":
            found += _advances_over(conn, ids)
    return found


def _advances_over(conn: psycopg.Connection[tuple[object, ...]], ids: list[str]) -> list[str]:
    rows = conn.execute(
        "SELECT w.id, w.lane, a.old_id, a.new_id, a.lease_owner, a.lease_mine, a.at, "
        "       pg_visible_in_snapshot(w.xid, a.snapshot), "
        "       EXISTS (SELECT 1 FROM chaos_held AS h WHERE h.id = w.id) "
        "FROM chaos_written AS w "
        "LEFT JOIN chaos_advances AS a "
        "    ON a.lane = w.lane AND w.id > a.old_id AND w.id <= a.new_id "
        "WHERE w.id = ANY(%s::uuid[]) ORDER BY w.id, a.at",
        (ids,),
    ).fetchall()
    return [
        f"{row[0]} lane {row[1]}: no advance passed it (held: {row[8]})"
        if row[2] is None
        else f"{row[0]} lane {row[1]} passed by the advance {row[2]} -> {row[3]} of {row[4]} "
        f"(mine {row[5]}) at {row[6]}; its writer's transaction committed in that advance's "
        f"snapshot: {row[7]}; copied into the held table: {row[8]}"
        for row in rows
    ]


def backlog(store: StoreSettings, loop: LoopThread) -> tuple[int, int]:
    """(rows pending, parked keys), as ``relayer status --all`` counts them: in partitioned
    mode the held rows and the outbox rows above their lane's progress, not the sent rows the
    partitions keep until rotation drops them."""

    async def summary() -> tuple[int, int]:
        dsn = store.require_dsn()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            read = await read_summary(conn, store)
        return read.pending, read.parked

    return loop.run(summary())
