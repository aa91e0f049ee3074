"""Where the ledger is, and connections to it: a SQLite file (the default) or a team's PostgreSQL.

`--ledger URL`, else `$ORCHESTRATOR_LEDGER`, else STATE/ledger.sqlite. A URL is
postgresql://USER@HOST:PORT/DB with libpq's parameters (sslmode, sslrootcert, passfile, ...), or a
SQLite file's path. A password comes from ~/.pgpass, $PGPASSWORD or a passfile; one left in the
URL is never shown.

A write opens a transaction and brings the schema to the newest version first (Alembic, one
migrator at a time). A read never migrates: it reads an older schema as it is. Each failure is a
StateError: one line naming the ledger, the driver's reason and what to do.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.pool import NullPool

from orchestrator.errors import StateError, one_line, short_path, state_dir_error
from orchestrator.ledger import schema
from orchestrator.paths import state_dir

ENV = "ORCHESTRATOR_LEDGER"
BUSY_TIMEOUT_S = 30.0  # how long a SQLite writer waits for another one before giving up
CONNECT_TIMEOUT_S = 10  # how long a PostgreSQL connection may take before the ledger is unreachable
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
#: pg_advisory_xact_lock's key while migrating: one migrator at a time ("orch-ldg").
_MIGRATION_LOCK = 0x6F7263686C6467

_chosen: str | None = None


def use(url: str | None) -> None:
    """The ledger that `--ledger` names for this process (None: the environment's, or the file)."""
    global _chosen
    _chosen = url or None


@dataclass(frozen=True)
class Where:
    """One ledger: its SQLAlchemy URL, and its file when it is SQLite."""

    url: sa.URL
    file: Path | None
    #: what chose it: --ledger, ORCHESTRATOR_LEDGER or the state directory
    source: str

    @property
    def sqlite(self) -> bool:
        return self.file is not None

    def shown(self) -> str:
        """The ledger for a message: a file's path, or the URL with any password hidden."""
        if self.file is not None:
            return short_path(self.file)
        return _masked(self.url.set(drivername="postgresql", port=self.url.port or 5432))


def _masked(url: sa.URL) -> str:
    """A URL as text with its password hidden: the user:PASSWORD@ part, and libpq's ?password=."""
    if "password" in url.query:
        url = url.update_query_dict({"password": "***"})
    return one_line(url.render_as_string(hide_password=True))


def where(text: str | None = None) -> Where:
    """The ledger in use (or the one `text` names)."""
    source = "--ledger" if _chosen else ENV
    text = text if text is not None else (_chosen or os.environ.get(ENV) or "")
    if not text.strip():
        return Where(sa.URL.create("sqlite"), state_dir() / "ledger.sqlite", "the state directory")
    return parse(text, source)


def parse(text: str, source: str = "the URL") -> Where:
    """A ledger URL or path as a Where; a StateError naming what to fix."""
    if "://" not in text:
        file = Path(text).expanduser()
        return Where(sa.URL.create("sqlite"), file, source)
    try:
        url = sa.make_url(text)
        url.port  # noqa: B018  (a port that is not a number fails here, not at the first connection)
    except (sa.exc.ArgumentError, ValueError):
        raise StateError(f"{source} {_hidden(text)} is not a ledger URL: {_FORMS}") from None
    backend = url.get_backend_name()
    if backend == "sqlite":
        if not url.database:
            raise StateError(f"{source} {_hidden(text)} names no file: sqlite:////abs/path/ledger.sqlite")
        return Where(sa.URL.create("sqlite"), Path(url.database).expanduser(), source)
    if backend != "postgresql" or url.get_driver_name() not in ("psycopg", "postgresql", ""):
        raise StateError(f"{source} {_hidden(text)}: {_FORMS}")
    if not url.database:
        raise StateError(f"{source} {_hidden(text)} names no database: postgresql://USER@HOST:PORT/DB")
    return Where(url.set(drivername="postgresql+psycopg"), None, source)


_FORMS = (
    "give postgresql://USER@HOST:PORT/DB (libpq's parameters after ?, e.g. sslmode=verify-full), "
    "or a SQLite file's path"
)


def _hidden(text: str) -> str:
    """A URL the user gave, for a message, without its password."""
    try:
        return _masked(sa.make_url(text))
    except (sa.exc.ArgumentError, ValueError):
        head, _, tail = text.partition("://")
        user_part, at, rest = tail.rpartition("@")
        if at and ":" in user_part:
            tail = f"{user_part.split(':')[0]}:***@{rest}"
        tail = re.sub(r"(password=)[^&]*", r"\1***", tail)
        return one_line(f"{head}://{tail}")


def origin() -> str:
    """This control machine, as the rows it writes name it."""
    return socket.gethostname()


# --- engines --------------------------------------------------------------------------------------


@functools.cache
def _engine(w: Where, writing: bool) -> sa.Engine:
    if w.file is None:
        # The URL's own connect_timeout and application_name win over these defaults.
        defaults = {"connect_timeout": CONNECT_TIMEOUT_S, "application_name": "orchestrator"}
        engine = sa.create_engine(
            w.url,
            connect_args={k: v for k, v in defaults.items() if k not in w.url.query},
            # Whatever the database's default: a claim or a migration reads what others committed.
            isolation_level="READ COMMITTED",
            pool_size=2,
            # A pooled connection the server dropped (a restart, a failover, idle_session_timeout) is
            # replaced, not reported as an unreachable ledger in the middle of a campaign.
            pool_pre_ping=True,
        )
        return engine
    file = w.file
    engine = sa.create_engine(
        "sqlite://",
        creator=(lambda: _open_sqlite(file)) if writing else (lambda: _open_read_only(file)),
        poolclass=NullPool,
    )

    # sqlite3 starts transactions itself, and not before DDL: the ledger starts them, so that a
    # migration is one transaction. A writer takes the write lock at once (BEGIN IMMEDIATE): two
    # writers queue on the busy timeout instead of failing on a lock upgrade.
    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writing else "BEGIN")

    return engine


def _open_sqlite(file: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(file, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    _use_wal(conn)
    return conn


def _use_wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL, waiting out a writer that opens the ledger at the same moment.

    Changing the journal mode takes an exclusive lock and SQLite does not call the
    busy handler for it, so two processes opening a new ledger together made one
    fail at once with "database is locked" (1 in about 120 in a stress run).
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _open_read_only(db: Path) -> sqlite3.Connection:
    """`mode=ro`, or `immutable=1` where that cannot open the ledger and nothing is lost by it.

    Reading a WAL ledger takes its -shm file, which a reader creates beside it; in a folder this
    user may not write, `mode=ro` fails (SQLITE_CANTOPEN). `immutable=1` reads without one but
    also skips the -wal, so it is used only when no -wal holds writes not yet merged into the file
    (the last writer to close merges them and removes it). Where the folder can be written, a
    reader leaves an empty -wal and the -shm there, as any SQLite reader of a WAL file does.
    """
    uri = db.resolve().as_uri()
    conn = sqlite3.connect(
        f"{uri}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    try:
        conn.execute("PRAGMA user_version")  # opening is lazy: a failure to open shows here
    except sqlite3.OperationalError as e:
        conn.close()
        if getattr(e, "sqlite_errorname", "") != "SQLITE_CANTOPEN":
            raise
        wal = db.with_name(db.name + "-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StateError(
                f"{db}: its newest records are still in {wal.name}, which cannot be read without "
                f"writing in {db.parent}: run a command that records (deploy, bench) once as a user "
                "who can write there"
            ) from e
        conn = sqlite3.connect(
            f"{uri}?mode=ro&immutable=1", uri=True, isolation_level=None, check_same_thread=False
        )
    # Text that is not UTF-8 (a hand edit) reaches the ledger's row checks as lone surrogates,
    # instead of sqlite3's "Could not decode to UTF-8" on the whole query.
    conn.text_factory = lambda raw: raw.decode("utf-8", "surrogateescape")
    return conn


# --- connections ----------------------------------------------------------------------------------


@contextmanager
def writing(w: Where | None = None) -> Iterator[sa.Connection]:
    """A connection in a transaction, with the schema migrated; commits on success."""
    w = w or where()
    if w.file is not None:
        _make_dir(w.file.parent)
        _check_file(w.file)
    with _explained(w, writing=True), _engine(w, True).connect() as conn, conn.begin():
        _migrate(conn, w)
        yield conn


@contextmanager
def reading(w: Where | None = None) -> Iterator[sa.Connection | None]:
    """A connection that reads, or None while there is no ledger yet.

    It never creates the file or migrates, so `history`, `results` and a rollback's look-up work
    on a ledger this user may only read (another user's, a backup, a read-only mount, a role with
    SELECT only). An older schema is read as it is; a write command migrates it.
    """
    w = w or where()
    if w.file is not None:
        _check_dir(w.file.parent)
        if not w.file.exists():
            yield None
            return
        _check_file(w.file)
    with _explained(w, writing=False), _engine(w, False).connect() as conn, conn.begin():
        version = version_of(conn, w)
        if w.file is not None:
            _check_schema(conn, version, w)
        yield conn


def _check_dir(folder: Path) -> None:
    """A state directory that is a file, or lies under one, can never hold the ledger."""
    for above in (folder, *folder.parents):
        if above.exists():
            if not above.is_dir():
                why = "is a file, not a directory" if above == folder else f"lies under a file ({above})"
                raise _dir_error(folder, why)
            return


def _make_dir(folder: Path) -> None:
    _check_dir(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _dir_error(folder, f"cannot be created ({e.strerror})") from e


def _dir_error(folder: Path, why: str) -> StateError:
    if folder.absolute() == state_dir().absolute():
        return state_dir_error(why)
    return StateError(f"ledger directory {folder} {why}")


def _check_file(db: Path) -> None:
    if db.exists() and not db.is_file():
        kind = "a directory" if db.is_dir() else "not a regular file"
        raise StateError(f"{db} is {kind}, not a ledger: {move_aside(db)}")


def move_aside(db: Path) -> str:
    return f"move it aside (mv {db} {db}.broken) and the next command that records starts an empty ledger"


#: SQLite's errors about the file rather than the query (extended codes start with these).
_CORRUPT = ("SQLITE_NOTADB", "SQLITE_CORRUPT")
_NO_ACCESS = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_IOERR", "SQLITE_FULL")
#: PostgreSQL's SQLSTATE classes and codes that say the ledger cannot be written: insufficient
#: privilege, a read-only transaction (a standby, default_transaction_read_only), a full disk.
_PG_NO_WRITE = ("42501", "25006", "53100")


@contextmanager
def _explained(w: Where, writing: bool) -> Iterator[None]:
    """The driver's errors about the ledger itself as a StateError naming it and what to do."""
    try:
        yield
    except sa.exc.DBAPIError as e:
        raise _explain(w, writing, e.orig or e) from e
    except sqlite3.DatabaseError as e:
        raise _explain(w, writing, e) from e


def _explain(w: Where, writing: bool, e: BaseException) -> BaseException:
    if w.file is not None:
        db = w.file
        name = getattr(e, "sqlite_errorname", "")
        if name.startswith(_CORRUPT):
            return StateError(f"{db} is not a readable ledger ({e}): {move_aside(db)}")
        if name.startswith(_NO_ACCESS):
            if (
                writing
                and db.parent.absolute() == state_dir().absolute()
                and not db.exists()  # no ledger yet, in a state directory that takes no file
            ):
                return state_dir_error(f"cannot be written ({e})")
            done, do = ("written", "write") if writing else ("read", "read")
            return StateError(
                f"{db} cannot be {done} ({e}): let this user {do} it and {db.parent}, "
                "or point ORCHESTRATOR_STATE_DIR at another directory"
            )
        return e
    reason = _reason(e)
    code = getattr(e, "sqlstate", None) or ""
    if code == "42501" and not writing:
        return StateError(
            f"ledger {w.shown()} cannot be read ({reason}): grant this role SELECT on the ledger's "
            f"tables, or point {w.source} at another ledger"
        )
    if code in _PG_NO_WRITE:
        return StateError(
            f"ledger {w.shown()} cannot be written ({reason}): {GRANT}, "
            f"or point {w.source} at a writable ledger"
        )
    if code in ("55P03", "57014", "40001", "40P01"):  # lock or statement timeout, serialization, deadlock
        return StateError(f"ledger {w.shown()} is busy ({reason}): run the command again")
    if not code and not _connection_error(e):
        if _driver_error(e):  # psycopg's own refusal, such as an unknown libpq parameter
            return StateError(f"ledger {w.shown()} cannot be used ({reason}): check its URL")
        return e
    if code.startswith("08") or code == "" or code.startswith(("28", "3D", "57P")):
        # 08: connection; 28: authentication; 3D: no such database; 57P: server shutting down
        return StateError(
            f"ledger {w.shown()} cannot be reached ({reason}): check the server, the user and "
            f"~/.pgpass, or point {w.source} at another ledger"
        )
    return e


GRANT = "grant this role INSERT and UPDATE on the ledger's tables, and USAGE on its sequences"


def _driver_error(e: BaseException) -> bool:
    import psycopg

    return isinstance(e, psycopg.Error)


def _connection_error(e: BaseException) -> bool:
    """psycopg's own errors about the connection (they carry no SQLSTATE)."""
    import psycopg

    return isinstance(e, (psycopg.OperationalError, psycopg.InterfaceError))


def _reason(e: BaseException) -> str:
    """The driver's reason, on one line."""
    text = str(e).strip() or type(e).__name__
    return one_line("; ".join(part.strip() for part in text.splitlines() if part.strip()))


# --- versions and migrations ----------------------------------------------------------------------


def version_of(conn: sa.Connection, w: Where) -> int:
    """The schema version, refused when newer than this code knows."""
    version = _stored_version(conn, w)
    if version > schema.HEAD:
        raise StateError(
            f"ledger {w.shown()} has schema version {version}, newer than this orchestrator knows "
            f"({schema.HEAD}): a newer orchestrator wrote it; use that one, or point "
            f"{'ORCHESTRATOR_STATE_DIR' if w.file is not None and w.source.startswith('the') else w.source} "
            "at another ledger"
        )
    return version


def _stored_version(conn: sa.Connection, w: Where) -> int:
    if has_table(conn, "alembic_version"):
        found = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
        if found is None:
            return 0
        if not str(found).isdigit():
            raise StateError(
                f"ledger {w.shown()} holds another program's migrations (alembic_version {found!r}): "
                "give the ledger a database of its own"
            )
        return int(found)
    if w.file is not None:  # a ledger of before Alembic: PRAGMA user_version counted migrations
        return int(conn.exec_driver_sql("PRAGMA user_version").scalar() or 0)
    return 0


def has_table(conn: sa.Connection, table: str) -> bool:
    if conn.dialect.name == "sqlite":
        query = "SELECT 1 FROM sqlite_master WHERE type='table' AND name=:t"
    else:
        query = "SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = :t"
    return conn.execute(sa.text(query), {"t": table}).first() is not None


def columns_of(conn: sa.Connection, table: str) -> frozenset[str]:
    """The columns `table` has in this ledger (its schema's version)."""
    if conn.dialect.name == "sqlite":
        rows = conn.execute(sa.text("SELECT name FROM pragma_table_info(:t)"), {"t": table})
    else:
        query = (
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = :t"
        )
        rows = conn.execute(sa.text(query), {"t": table})
    return frozenset(r[0] for r in rows)


def _migrate(conn: sa.Connection, w: Where) -> None:
    version = version_of(conn, w)
    if w.file is not None:
        _check_schema(conn, version, w)
    if version == schema.HEAD:
        return
    if conn.dialect.name == "postgresql":  # one migrator; the other waits, then sees the new version
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
        version = version_of(conn, w)
        if version == schema.HEAD:
            return
    from alembic import command

    config = _alembic_config(conn)
    if version and not has_table(conn, "alembic_version"):
        command.stamp(config, f"{version:04d}")  # a SQLite ledger of before Alembic
    for number in range(version + 1, schema.HEAD + 1):  # one at a time, to name the one that fails
        try:
            command.upgrade(config, f"{number:04d}")
        except sa.exc.DBAPIError as e:
            if w.file is None:
                raise
            raise _half_migrated(w.file, version, f"migration {number} fails: {e.orig}") from e
    if w.file is not None:  # an orchestrator of before Alembic refuses it as newer
        conn.exec_driver_sql(f"PRAGMA user_version={schema.HEAD}")


def _alembic_config(conn: sa.Connection) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = conn
    return config


def _check_schema(conn: sa.Connection, version: int, w: Where) -> None:
    """Every table and column the first `version` migrations make is there (SQLite only: a file
    can be edited by hand, or cut off mid-migration by an older orchestrator)."""
    assert w.file is not None
    wrong = []
    for table, columns in sorted(expected_columns(version).items()):
        have = columns_of(conn, table)
        if not have:
            wrong.append(f"table {table} is missing")
        elif missing := sorted(columns - have):
            wrong.append(f"{table} lacks {', '.join(missing)}")
    if wrong:
        raise _half_migrated(w.file, version, "; ".join(wrong))


def _half_migrated(db: Path, version: int, what: str) -> StateError:
    return StateError(f"{db} is half-migrated (schema version {version}, but {what}): {move_aside(db)}")


@functools.cache
def expected_columns(version: int) -> dict[str, frozenset[str]]:
    """The tables and columns after the first `version` migrations."""
    if version == schema.HEAD:
        return {t.name: frozenset(t.columns.keys()) for t in schema.metadata.sorted_tables}
    if version == 0:
        return {}
    engine = sa.create_engine("sqlite://", poolclass=sa.pool.StaticPool)
    from alembic import command

    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), f"{version:04d}")
        tables = [t for t in sa.inspect(conn).get_table_names() if t != "alembic_version"]
        return {t: columns_of(conn, t) for t in tables}
