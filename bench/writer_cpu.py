"""bench/writer.py --cpu: the writer's own client CPU, per path, against a bare execute.

One process commits ``--rows`` rows (one a transaction) through ``Outbox.write`` on each path
(a psycopg connection, an async one, an SQLAlchemy Session, Django's connection in
``transaction.atomic()``), and as many through a bare psycopg ``execute`` of the same row (the
same statement and values, ids made before the clock starts) on the same connection, in blocks
that alternate. The process's CPU (every thread: the waker's counts) is read around each block
with ``time.process_time``; a path's cost a row is the median of its blocks. The difference is
what ``Outbox.write`` adds to the application's process for one row: validation, the lane, the
id, the statement, the hand-off to the waker and the waker's own work.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from relayer import Outbox
from relayer.ids import uuid7
from relayer.lanes import lane_for
from relayer.settings import StoreSettings
from relayer.sql import queries_for
from relayer.store.outbox import EncodedJson

BODY = b"x" * 200
KEYS = 1_000
BLOCK = 500  # rows a block; the paths' blocks alternate
NO_HEADERS = EncodedJson(b"{}")


def keys(count: int, start: int) -> list[str]:
    return [f"customer-{(start + index) % KEYS}" for index in range(count)]


def bare_rows(store: StoreSettings, count: int, start: int) -> list[tuple[Any, ...]]:
    """The rows Outbox.write would insert, made before the clock starts."""
    return [
        (uuid7(), lane_for(key, store.lanes), key, None, "orders", BODY, NO_HEADERS, None)
        for key in keys(count, start)
    ]


class Path:
    """One way an application writes: a block of relayer writes and a block of bare executes,
    one row a transaction, each committed."""

    name = ""

    def __init__(self, outbox: Outbox, insert: str) -> None:
        self.outbox = outbox
        self.insert = insert

    def relayer(self, keys: list[str]) -> None:
        raise NotImplementedError

    def bare(self, rows: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # For code_cost: many writes in one transaction, rolled back.
    def begin(self) -> Any:
        """Open a transaction with a real statement; the psycopg connection under the path."""
        raise NotImplementedError

    def relayer_uncommitted(self, keys: list[str]) -> None:
        raise NotImplementedError

    def bare_uncommitted(self, rows: list[tuple[Any, ...]]) -> None:
        """``bare`` without the commits: the driver's execute on the connection reached as the
        application reaches it through the path's object."""
        raise NotImplementedError

    # The statement through the library's own execute (SQLAlchemy's exec_driver_sql, a Django
    # cursor), without the commits; None on the psycopg paths (the driver is the library).
    orm_uncommitted: Callable[[list[tuple[Any, ...]]], None] | None = None

    def end(self) -> None:
        raise NotImplementedError


class PsycopgPath(Path):
    name = "psycopg"

    def __init__(self, outbox: Outbox, insert: str) -> None:
        super().__init__(outbox, insert)
        self.conn = psycopg.connect(outbox.store.require_dsn())

    def relayer(self, keys: list[str]) -> None:
        conn, write = self.conn, self.outbox.write
        for key in keys:
            write(conn, destination="orders", body=BODY, key=key)
            conn.commit()

    def bare(self, rows: list[tuple[Any, ...]]) -> None:
        conn, insert = self.conn, self.insert
        for row in rows:
            conn.execute(insert, row)
            conn.commit()

    def close(self) -> None:
        self.conn.close()

    def begin(self) -> Any:
        self.conn.execute("SELECT 1")
        return self.conn

    def relayer_uncommitted(self, keys: list[str]) -> None:
        conn, write = self.conn, self.outbox.write
        for key in keys:
            write(conn, destination="orders", body=BODY, key=key)

    def bare_uncommitted(self, rows: list[tuple[Any, ...]]) -> None:
        conn, insert = self.conn, self.insert
        for row in rows:
            conn.execute(insert, row)

    def end(self) -> None:
        self.conn.rollback()


class AsyncPath(Path):
    name = "psycopg async"

    def __init__(self, outbox: Outbox, insert: str) -> None:
        super().__init__(outbox, insert)
        self.loop = asyncio.new_event_loop()
        dsn = outbox.store.require_dsn()
        self.conn = self.loop.run_until_complete(psycopg.AsyncConnection.connect(dsn))

    def relayer(self, keys: list[str]) -> None:
        async def run() -> None:
            conn, write = self.conn, self.outbox.write_async
            for key in keys:
                await write(conn, destination="orders", body=BODY, key=key)
                await conn.commit()

        self.loop.run_until_complete(run())

    def bare(self, rows: list[tuple[Any, ...]]) -> None:
        async def run() -> None:
            conn, insert = self.conn, self.insert
            for row in rows:
                await conn.execute(insert, row)
                await conn.commit()

        self.loop.run_until_complete(run())

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()

    def begin(self) -> Any:
        self.loop.run_until_complete(self.conn.execute("SELECT 1"))
        return self.conn

    def relayer_uncommitted(self, keys: list[str]) -> None:
        async def run() -> None:
            conn, write = self.conn, self.outbox.write_async
            for key in keys:
                await write(conn, destination="orders", body=BODY, key=key)

        self.loop.run_until_complete(run())

    def bare_uncommitted(self, rows: list[tuple[Any, ...]]) -> None:
        async def run() -> None:
            conn, insert = self.conn, self.insert
            for row in rows:
                await conn.execute(insert, row)

        self.loop.run_until_complete(run())

    def end(self) -> None:
        self.loop.run_until_complete(self.conn.rollback())


class SQLAlchemyPath(Path):
    """A Session on the psycopg driver; the bare execute runs on the session's own driver
    connection (``session.connection()`` begins the session's transaction, as a write does)."""

    name = "SQLAlchemy Session"

    def __init__(self, outbox: Outbox, insert: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        super().__init__(outbox, insert)
        url = outbox.store.require_dsn().replace("postgresql://", "postgresql+psycopg://", 1)
        self.engine = create_engine(url)
        self.session = Session(self.engine)

    def relayer(self, keys: list[str]) -> None:
        session, write = self.session, self.outbox.write
        for key in keys:
            write(session, destination="orders", body=BODY, key=key)
            session.commit()

    def bare(self, rows: list[tuple[Any, ...]]) -> None:
        session, insert = self.session, self.insert
        for row in rows:
            session.connection().connection.dbapi_connection.execute(insert, row)
            session.commit()

    def close(self) -> None:
        self.session.close()
        self.engine.dispose()

    def begin(self) -> Any:
        self.session.connection().exec_driver_sql("SELECT 1")
        return self.session.connection().connection.dbapi_connection

    def relayer_uncommitted(self, keys: list[str]) -> None:
        session, write = self.session, self.outbox.write
        for key in keys:
            write(session, destination="orders", body=BODY, key=key)

    def bare_uncommitted(self, rows: list[tuple[Any, ...]]) -> None:
        session, insert = self.session, self.insert
        for row in rows:
            session.connection().connection.dbapi_connection.execute(insert, row)

    def orm_uncommitted(self, rows: list[tuple[Any, ...]]) -> None:
        session, insert = self.session, self.insert
        for row in rows:
            session.connection().exec_driver_sql(insert, row)

    def end(self) -> None:
        self.session.rollback()


class DjangoPath(Path):
    """Django's connection in ``transaction.atomic()``; the bare execute runs on the psycopg
    connection under it."""

    name = "Django atomic"

    def __init__(self, outbox: Outbox, insert: str) -> None:
        import django
        from django.conf import settings

        super().__init__(outbox, insert)
        info = conninfo_to_dict(outbox.store.require_dsn())
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": info.get("dbname", ""),
            "USER": info.get("user", ""),
            "PASSWORD": info.get("password", ""),
            "HOST": info.get("host", ""),
            "PORT": info.get("port", ""),
        }
        settings.configure(DATABASES={"default": database}, USE_TZ=True)
        django.setup()

    def relayer(self, keys: list[str]) -> None:
        from django.db import connection, transaction

        write = self.outbox.write
        for key in keys:
            with transaction.atomic():
                write(connection, destination="orders", body=BODY, key=key)

    def bare(self, rows: list[tuple[Any, ...]]) -> None:
        from django.db import connection, transaction

        insert = self.insert
        for row in rows:
            with transaction.atomic():
                connection.connection.execute(insert, row)

    def close(self) -> None:
        from django.db import connections

        connections.close_all()

    def begin(self) -> Any:
        from django.db import connection, transaction

        self.atomic = transaction.atomic()
        self.atomic.__enter__()
        connection.connection.execute("SELECT 1")
        return connection.connection

    def relayer_uncommitted(self, keys: list[str]) -> None:
        from django.db import connection

        write = self.outbox.write
        for key in keys:
            write(connection, destination="orders", body=BODY, key=key)

    def bare_uncommitted(self, rows: list[tuple[Any, ...]]) -> None:
        from django.db import connection

        insert = self.insert
        for row in rows:
            connection.connection.execute(insert, row)

    def orm_uncommitted(self, rows: list[tuple[Any, ...]]) -> None:
        from django.db import connection

        insert = self.insert
        for row in rows:
            with connection.cursor() as cursor:
                cursor.execute(insert, row)

    def end(self) -> None:
        from django.db import transaction

        transaction.set_rollback(True)
        self.atomic.__exit__(None, None, None)


PATHS: dict[str, type[Path]] = {
    "psycopg": PsycopgPath,
    "async": AsyncPath,
    "sqlalchemy": SQLAlchemyPath,
    "django": DjangoPath,
}


@dataclass
class Costs:
    """CPU seconds a row, block by block: the whole process, and its main thread alone (the
    writes themselves, without the waker's thread)."""

    process: list[float] = field(default_factory=list)
    main: list[float] = field(default_factory=list)

    def add(self, run: Callable[[], None]) -> None:
        process, main = time.process_time(), time.thread_time()
        run()
        self.process.append((time.process_time() - process) / BLOCK)
        self.main.append((time.thread_time() - main) / BLOCK)

    def median(self) -> tuple[float, float]:
        return statistics.median(self.process), statistics.median(self.main)


def measure(path: Path, store: StoreSettings, rows: int) -> dict[str, Costs]:
    """The relayer blocks' and the bare blocks' costs, the blocks alternating."""
    path.relayer(keys(BLOCK, 0))  # warm: connection, lane-count check, the waker's thread
    path.bare(bare_rows(store, BLOCK, 0))
    costs = {"relayer": Costs(), "bare": Costs()}
    for number in range(max(1, rows // BLOCK)):
        written = keys(BLOCK, number * BLOCK)
        ready = bare_rows(store, BLOCK, number * BLOCK)
        runs = {"relayer": partial(path.relayer, written), "bare": partial(path.bare, ready)}
        for kind in sorted(runs, reverse=number % 2 == 1):
            costs[kind].add(runs[kind])
        path.outbox.flush()
    return costs


def code_cost(path: Path, rows: int) -> dict[str, float]:
    """CPU seconds a row (the fewest of 7 runs of ``rows``) inside one open transaction
    (rolled back) with the driver's execute replaced by nothing, so that only the Python
    around it counts: ``write``, Outbox.write on the path's object (the waker's thread counts:
    it looks at an open transaction); ``bare``, the driver's execute on the connection reached
    as the application reaches it (``bare_uncommitted``); ``orm``, the statement through the
    library's own execute (``orm_uncommitted``; absent on the psycopg paths). The kinds take
    turns within each of the 7 rounds."""
    driver = path.begin()
    if isinstance(driver, psycopg.AsyncConnection):

        async def nothing_async(*arguments: Any, **options: Any) -> None:
            return None

        driver.execute = nothing_async  # type: ignore[method-assign]
    else:
        driver.execute = lambda *arguments, **options: None
    runs: dict[str, Callable[[], None]] = {
        "write": partial(path.relayer_uncommitted, keys(rows, 0)),
        "bare": partial(path.bare_uncommitted, bare_rows(path.outbox.store, rows, 0)),
    }
    if path.orm_uncommitted is not None:
        runs["orm"] = partial(_without_cursor_execute, path.orm_uncommitted, runs["bare"])
    fewest: dict[str, float] = {}
    try:
        for _ in range(7):
            for kind, run in runs.items():
                started = time.process_time()
                run()
                spent = (time.process_time() - started) / rows
                fewest[kind] = min(spent, fewest.get(kind, spent))
        return fewest
    finally:
        del driver.execute
        path.end()


def _without_cursor_execute(
    run: Callable[[list[tuple[Any, ...]]], None], bare: partial[None]
) -> None:
    """``run`` on the bare rows with psycopg's ``Cursor.execute`` replaced by nothing (the
    libraries execute through a cursor of the driver connection)."""
    original = psycopg.Cursor.execute
    psycopg.Cursor.execute = lambda self, *arguments, **options: self  # type: ignore[method-assign]
    try:
        run(*bare.args)
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]


def report(store: StoreSettings, rows: int, names: list[str], in_situ: bool = True) -> list[str]:
    """The table: client CPU a row of each path, relayer against bare, and the difference;
    the process's (the waker's thread included) and the main thread's alone. Then the own
    code's table (code_cost); ``in_situ`` False gives that one alone."""
    insert = queries_for(store.names)["insert_message"]
    lines = [
        f"client CPU a row (one row a transaction, committed; notify = {store.notify}; "
        f"{rows:,} rows a side in blocks of {BLOCK}, alternating; medians of the blocks), "
        "µs: the process (every thread), and its main thread alone (the writes themselves)",
        "| path | process: Outbox.write / bare execute / difference "
        "| main thread: Outbox.write / bare execute / difference |",
        "|---|---|---|",
    ]
    code = [
        f"the writer's own code: µs a row with the driver's execute replaced by nothing (the "
        f"fewest of 7 runs of {rows:,} rows in one open transaction, the kinds in turn)",
        "| path | Outbox.write | bare execute (the driver connection reached through the "
        "path's object) | the library's own execute | write - bare | write - library |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        path = PATHS[name](Outbox(store), insert)
        try:
            if in_situ:
                lines.append(_in_situ_line(path, measure(path, store, rows)))
            else:
                path.relayer(keys(BLOCK, 0))  # warm, as measure does
            code.append(_code_line(path.name, code_cost(path, rows)))
        finally:
            path.close()
    return (lines if in_situ else []) + code


def _in_situ_line(path: Path, costs: dict[str, Costs]) -> str:
    (process, main), (bare_process, bare_main) = (
        costs["relayer"].median(),
        costs["bare"].median(),
    )
    return (
        f"| {path.name} | {process * 1e6:.1f} / {bare_process * 1e6:.1f} / "
        f"{(process - bare_process) * 1e6:+.1f} | {main * 1e6:.1f} / {bare_main * 1e6:.1f}"
        f" / {(main - bare_main) * 1e6:+.1f} |"
    )


def _code_line(name: str, cost: dict[str, float]) -> str:
    write, bare, orm = cost["write"] * 1e6, cost["bare"] * 1e6, cost.get("orm")
    library = "-" if orm is None else f"{orm * 1e6:.2f}"
    versus = "-" if orm is None else f"{write - orm * 1e6:+.2f}"
    return f"| {name} | {write:.2f} | {bare:.2f} | {library} | {write - bare:+.2f} | {versus} |"
