"""A throwaway PostgreSQL cluster for the tests: initdb in a temporary directory, started with ``pg_ctl``.

Why not a shared server: every run (and every xdist worker) gets its own cluster on a free loopback port, so
nothing on the machine is touched, no credentials are needed (``trust`` on 127.0.0.1 and a private socket
directory) and nothing survives the run. Durability is switched off (``fsync``, ``full_page_writes``,
``synchronous_commit``): a crashed test cluster is thrown away anyway, and these make DDL and commits cheap.

``initdb`` and ``postgres`` refuse to run as root, so as root the cluster's directory is handed to the
``postgres`` user (which Debian's ``postgresql`` package creates) and the server programs run under
``runuser -u postgres --``; any other user runs them directly.

``pg_trgm`` is created in ``template1``, so every database made later with CREATE DATABASE has it (regex
search on PostgreSQL relies on it).
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

BIN_NAMES = ("initdb", "pg_ctl", "postgres")
DEBIAN_GLOB = "/usr/lib/postgresql/*/bin"
SUPERUSER = "postgres"
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "300",
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "off",
    # Tests create and drop many databases; the checkpointer need not chase them.
    "checkpoint_timeout": "30min",
    "max_wal_size": "1GB",
}
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
HINT = (
    "PostgreSQL server binaries (initdb, pg_ctl, postgres) are needed by the tests: install Debian's "
    "`postgresql postgresql-contrib` (.ci/run does so as root) or put a bin directory holding them on PATH."
)


class ClusterError(RuntimeError):
    """The cluster could not be found, initialised or started; the message says why (log tail included)."""


def _version_key(bin_dir: Path) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", bin_dir.parent.name)) or (0,)


def find_bin_dir() -> Path:
    """The directory with ``initdb``, ``pg_ctl`` and ``postgres``: PATH first, else Debian's newest version.

    The PATH entries are resolved (Debian links ``initdb`` into /usr/local/bin or /usr/bin) so that all
    three come from one installation: ``pg_ctl`` starts the ``postgres`` next to it.
    """
    found = [shutil.which(name) for name in BIN_NAMES]
    candidates: list[Path] = []
    if all(found):
        candidates.append(Path(str(found[0])).resolve().parent)
    candidates += sorted((Path(p) for p in glob.glob(DEBIAN_GLOB)), key=_version_key, reverse=True)
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in BIN_NAMES):
            return directory
    raise ClusterError(f"no PostgreSQL server binaries on PATH or under {DEBIAN_GLOB}. {HINT}")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """One PostgreSQL cluster in a temporary directory. ``start()`` returns once it accepts connections."""

    def __init__(self, bin_dir: Path | None = None, settings: dict[str, str] | None = None) -> None:
        self._bin_dir = bin_dir
        self._settings = {**SETTINGS, **(settings or {})}
        self._lock = threading.Lock()
        self._admin: psycopg.Connection[TupleRow] | None = None
        self.base: Path | None = None
        self.port = 0

    # Layout: base/ (0700) holds data/ (initdb's, 0700), sock/ (0700) and server.log (0600).
    @property
    def data_dir(self) -> Path:
        assert self.base is not None, "cluster not started"
        return self.base / "data"

    @property
    def log_file(self) -> Path:
        assert self.base is not None, "cluster not started"
        return self.base / "server.log"

    def start(self) -> Cluster:
        if self.base is not None:
            raise ClusterError("cluster already started")
        self._bin_dir = self._bin_dir or find_bin_dir()
        self.base = Path(tempfile.mkdtemp(prefix="lcm-pg-"))
        atexit.register(self.stop)
        try:
            self._init_and_start(self._bin_dir)
        except BaseException:
            self.stop()
            raise
        return self

    def _init_and_start(self, bin_dir: Path) -> None:
        assert self.base is not None
        (self.base / "sock").mkdir(mode=0o700)
        self.log_file.touch(mode=0o600)
        if os.geteuid() == 0:
            self._hand_to_postgres_user()
        initdb = [str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER, "-A", "trust"]
        self._run([*initdb, "-E", "UTF8", "--no-locale", "--no-sync"], "initdb")
        # Retry on a lost race for the port (another process may bind it between free_port() and the server).
        for attempt in range(3):
            self.port = free_port()
            self._write_settings()
            try:
                pg_ctl = [str(bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file)]
                self._run([*pg_ctl, "-w", "-t", "60", "start"], "pg_ctl start")
                break
            except ClusterError:
                if attempt == 2 or "could not bind" not in self._log_tail():
                    raise
        self._admin = self._connect("postgres")
        with self._connect("template1") as conn:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            except psycopg.Error as exc:
                raise ClusterError(f"pg_trgm is not available ({exc}); install postgresql-contrib") from exc

    def _hand_to_postgres_user(self) -> None:
        assert self.base is not None
        try:
            user = pwd.getpwnam(SUPERUSER)
        except KeyError:
            raise ClusterError(
                f"running as root, and initdb refuses root; no '{SUPERUSER}' system user to run it as. "
                "Run the tests as a normal user, or install Debian's postgresql package (it creates the user)."
            ) from None
        if shutil.which("runuser") is None:
            raise ClusterError("running as root, and initdb refuses root; runuser (util-linux) is needed")
        for path in (self.base, self.base / "sock", self.log_file):
            os.chown(path, user.pw_uid, user.pw_gid)

    def _write_settings(self) -> None:
        lines = [f"{key} = {value}" for key, value in self._settings.items()]
        lines += [f"port = {self.port}", f"unix_socket_directories = '{self.base}/sock'"]
        # postgresql.auto.conf is read last, and rewriting it whole makes a retry on another port idempotent.
        (self.data_dir / "postgresql.auto.conf").write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _run(self, argv: list[str], what: str) -> None:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", SUPERUSER, "--", *argv]
        # A fixed, minimal locale: initdb and the server must not depend on the caller's LANG.
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        try:
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ClusterError(f"{what} failed: {exc}\n{self._log_tail()}") from exc
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip()[-2000:]
            raise ClusterError(
                f"{what} failed (exit {done.returncode}): {' '.join(argv)}\n{output}\n"
                f"--- server log tail ({self.log_file}) ---\n{self._log_tail()}"
            )

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_file.read_text(encoding="utf-8", errors="replace")
        except (OSError, AssertionError):
            return "(no server log)"
        return "\n".join(text.splitlines()[-lines:]) or "(server log empty)"

    def _connect(self, dbname: str) -> psycopg.Connection[TupleRow]:
        return psycopg.connect(self.dsn(dbname), autocommit=True, connect_timeout=10)

    def dsn(self, dbname: str) -> str:
        if not self.port:
            raise ClusterError("cluster not started")
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        """CREATE DATABASE from template1 (so it has pg_trgm); returns its DSN."""
        self._execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(_checked(name))))
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drops it even with connections left open (a test's leaked pool): FORCE terminates them."""
        self._execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(_checked(name))))

    def _execute(self, statement: sql.Composed) -> None:
        with self._lock:
            if self._admin is None:
                raise ClusterError("cluster not started")
            self._admin.execute(statement)

    def stop(self) -> None:
        """Stop the server (immediate: nothing in it is worth a checkpoint) and delete the directory."""
        with self._lock:
            if self._admin is not None:
                self._admin.close()
                self._admin = None
        if self.base is None:
            return
        if (self.data_dir / "postmaster.pid").exists() and self._bin_dir is not None:
            pg_ctl = [str(self._bin_dir / "pg_ctl"), "-D", str(self.data_dir)]
            with contextlib.suppress(ClusterError):  # already gone: the directory goes anyway
                self._run([*pg_ctl, "-m", "immediate", "-w", "stop"], "pg_ctl stop")
        shutil.rmtree(self.base, ignore_errors=True)
        self.base = None
        self.port = 0
        atexit.unregister(self.stop)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _checked(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"database name must match {_NAME.pattern}: {name!r}")
    return name
