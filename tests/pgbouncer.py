"""A real PgBouncer in front of the test PostgreSQL (Debian's package, ``apt-get install
pgbouncer``; CI installs it, a developer machine without it skips these tests with the reason).

Each instance pools by transaction (``pool_mode = transaction``) with ``default_pool_size`` 2,
so that consecutive transactions of one client land on different server connections; the
*strict* one also runs ``DISCARD ALL`` whenever a server connection changes hands
(``server_reset_query_always = 1``), so any state a client leaves in a session (a ``SET``, a
``LISTEN``, a prepared statement, a session advisory lock) is gone for certain. Every database
of the server is reachable through it under its own name (``* =`` in ``[databases]``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from relayer.embedded import free_port, wait_for_port

# Debian installs it outside a normal user's PATH.
_PLACES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer")
# PgBouncer refuses to run as root; as root the tests run it as this user (Debian's PostgreSQL
# package creates it), or as nobody.
_USERS = ("postgres", "nobody")


def find_pgbouncer() -> str | None:
    """The pgbouncer executable, or None when it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((place for place in _PLACES if os.access(place, os.X_OK)), None)


class PgBouncer:
    """One PgBouncer process on a free port of 127.0.0.1; ``start``, ``stop`` (by its pid),
    ``restart`` (same port), ``dsn_for`` (a DSN of the server, through it)."""

    def __init__(
        self, binary: str, server: str, *, pool_size: int = 2, reset_always: bool = False
    ) -> None:
        self.binary = binary
        self.server = conninfo_to_dict(server)
        self.pool_size = pool_size
        self.reset_always = reset_always
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="relayer-pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None
        self._user = None if os.geteuid() != 0 else _unprivileged_user()

    def _ini(self) -> str:
        host = str(self.server.get("host") or "127.0.0.1").split(",")[0]
        port = str(self.server.get("port") or 5432).split(",")[0]
        user = str(self.server.get("user") or "postgres")
        lines = [
            "[databases]",
            f"* = host={host} port={port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.folder / 'userlist.txt'}",
            f"admin_users = {user}",
            "pool_mode = transaction",
            f"default_pool_size = {self.pool_size}",
            "max_client_conn = 1000",
            # Clients wait for a server connection (heartbeats queue behind batches).
            "query_wait_timeout = 60",
            f"logfile = {self.folder / 'pgbouncer.log'}",
            f"pidfile = {self.folder / 'pgbouncer.pid'}",
        ]
        if self.reset_always:
            lines += ["server_reset_query = DISCARD ALL", "server_reset_query_always = 1"]
        return "\n".join(lines) + "\n"

    def start(self) -> PgBouncer:
        users = {str(self.server.get("user") or "postgres"), "postgres"}
        (self.folder / "userlist.txt").write_text("".join(f'"{user}" ""\n' for user in users))
        config = self.folder / "pgbouncer.ini"
        config.write_text(self._ini())
        command = [self.binary, "-q", str(config)]
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            for path in (self.folder, *self.folder.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            command[1:1] = ["-u", self._user]
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            wait_for_port(self.port, 15, self.process)
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"pgbouncer did not start: {exc}: {self.log()[-2000:]}") from exc
        return self

    def stop(self, signum: int = signal.SIGINT) -> None:
        """Stop the process (SIGINT: at once, closing every connection; SIGKILL: a crash)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signum)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self, signum: int = signal.SIGKILL) -> None:
        """Kill it and start it again on the same port (clients lose their connections)."""
        self.stop(signum)
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def dsn_for(self, dsn: str) -> str:
        """``dsn`` (a database of the server) through this PgBouncer: same database and user."""
        params = conninfo_to_dict(dsn)
        return make_conninfo(
            "",
            host="127.0.0.1",
            port=str(self.port),
            dbname=str(params.get("dbname") or "postgres"),
            user=str(params.get("user") or self.server.get("user") or "postgres"),
            sslmode="disable",
        )

    def show(self, what: str) -> list[dict[str, Any]]:
        """``SHOW what`` on the admin console (POOLS, SERVERS, CLIENTS...), rows as dicts."""
        admin = make_conninfo(self.dsn_for(make_conninfo("", dbname="pgbouncer")))
        with psycopg.connect(admin, autocommit=True, prepare_threshold=None) as conn:
            cursor = conn.execute(f"SHOW {what}".encode())
            names = [column.name for column in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _unprivileged_user() -> str:
    for user in _USERS:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(user)
            return user
    raise RuntimeError("no unprivileged user (postgres, nobody) to run pgbouncer as")
