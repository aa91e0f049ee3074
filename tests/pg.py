"""A throwaway PostgreSQL server for the tests, from Debian's `postgresql` package.

One cluster lives in a temporary directory. It listens on 127.0.0.1 only, on a free port, and
trusts every connection. As root, initdb and pg_ctl run as the `postgres` user: initdb refuses root.
"""

from __future__ import annotations

import atexit
import itertools
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

BIN_GLOB = "/usr/lib/postgresql/*/bin"
SETUP_HINT = "run `bash scripts/setup.sh --test` (it installs Debian's postgresql package)"
SUPERUSER = "postgres"
READER = "reader"
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "100",
    "shared_buffers": "16MB",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "log_min_messages": "warning",
}


class PostgresMissing(RuntimeError):
    """PostgreSQL's binaries, or the user to run them as, are not on this machine."""


def bindir() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin that has initdb."""
    found = [p for p in Path("/").glob(BIN_GLOB.lstrip("/")) if (p / "initdb").is_file()]
    if not found:
        raise PostgresMissing(f"PostgreSQL is not installed (no {BIN_GLOB}/initdb): {SETUP_HINT}")
    return max(found, key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.name)] or [0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dbname(db: str) -> str:
    """A database's name, from its name or its URL."""
    return db.rsplit("/", 1)[-1] if "://" in db else db


def _clean_env() -> dict[str, str]:
    """This environment without PG* variables: they would redirect psql and pg_ctl."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _reachable_by_others(path: Path) -> bool:
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents])


class Postgres:
    """A running cluster. Make one with Postgres.start()."""

    _names = itertools.count()

    def __init__(self, root: Path, bindir: Path, as_user: list[str]) -> None:
        self.root = root
        self.bindir = bindir
        self.data = root / "data"
        self.sockets = root / "run"
        self.log = root / "postgres.log"
        self.port = 0
        self._as_user = as_user
        self._running = False

    @classmethod
    def start(cls) -> Postgres:
        """initdb and start a fresh cluster; stop() removes it."""
        bin_ = bindir()
        as_user: list[str] = []
        parent = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(SUPERUSER)
            except KeyError:
                raise PostgresMissing(
                    f"there is no `{SUPERUSER}` user to run PostgreSQL as: {SETUP_HINT}"
                ) from None
            as_user = ["runuser", "-u", SUPERUSER, "--"]
            # The postgres user must reach the directory: TMPDIR may be root's alone.
            if not _reachable_by_others(Path(tempfile.gettempdir())):
                parent = "/tmp"
        root = Path(tempfile.mkdtemp(prefix="orchestrator-pg-", dir=parent))
        if as_user:
            shutil.chown(root, SUPERUSER, SUPERUSER)
        pg = cls(root, bin_, as_user)
        try:
            pg._initdb()
            pg._start()
        except BaseException:
            pg.stop()
            raise
        atexit.register(pg.stop)  # in case the session's finalizer never runs
        return pg

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """One of PostgreSQL's server programs, as the cluster's owner."""
        return subprocess.run(
            [*self._as_user, str(self.bindir / argv[0]), *argv[1:]],
            cwd=self.root,
            env=_clean_env(),
            capture_output=True,
            text=True,
            check=False,
        )

    def _initdb(self) -> None:
        done = self._run(
            "initdb",
            "-D",
            str(self.data),
            "--auth=trust",
            "-U",
            SUPERUSER,
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )
        if done.returncode:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        settings = {**SETTINGS, "unix_socket_directories": f"'{self.sockets}'"}
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{key} = {value}\n" for key, value in settings.items())
        self.sockets.mkdir()
        if self._as_user:
            shutil.chown(self.sockets, SUPERUSER, SUPERUSER)

    def _start(self) -> None:
        """pg_ctl start on a free port; another port if that one was taken meanwhile."""
        for _ in range(5):
            self.port = free_port()
            done = self._run(
                "pg_ctl",
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                f"-p {self.port}",
            )
            if not done.returncode:
                self._running = True
                return
            log = self.log.read_text() if self.log.exists() else ""
            if "could not bind" not in log and "already in use" not in log:
                break
            self.log.write_text("")
        raise RuntimeError(f"pg_ctl start failed:\n{done.stdout}{done.stderr}\n{log}")

    def url(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        """A SQLAlchemy URL (psycopg 3) for one database."""
        return f"postgresql+psycopg://{user}@127.0.0.1:{self.port}/{dbname}"

    def psql(self, sql: str, db: str = "postgres", user: str = SUPERUSER) -> str:
        """Run SQL with psql, over TCP; its unaligned output. Raises on the first error."""
        done = subprocess.run(
            [
                str(self.bindir / "psql"),
                *("-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"),
                *("-h", "127.0.0.1", "-p", str(self.port), "-U", user, "-d", _dbname(db)),
            ],
            input=sql,
            env=_clean_env(),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"psql failed ({done.returncode}) on {sql!r}:\n{done.stderr}")
        return done.stdout

    def create_db(self, prefix: str = "test") -> str:
        """A fresh, empty database with a unique name; its URL."""
        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        self.psql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_db(self, db: str) -> None:
        """Drop a database, closing its connections first."""
        self.psql(f'DROP DATABASE IF EXISTS "{_dbname(db)}" WITH (FORCE)')

    def readonly_url(self, db: str) -> str:
        """A URL for the role `reader`, which may only SELECT from public's tables, now and later."""
        name = _dbname(db)
        self.psql(
            f"DO $$ BEGIN CREATE ROLE {READER} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;\n"
            f'GRANT CONNECT ON DATABASE "{name}" TO {READER};\n'
            f"GRANT USAGE ON SCHEMA public TO {READER};\n"
            f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {READER};\n"
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {READER};\n",
            name,
        )
        return self.url(name, READER)

    def stop(self) -> None:
        """Stop the server at once and remove its directory. Safe to call twice."""
        if self._running:
            self._run("pg_ctl", "stop", "-m", "immediate", "-w", "-D", str(self.data))
            self._running = False
        shutil.rmtree(self.root, ignore_errors=True)
