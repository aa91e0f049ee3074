"""The local ledger: one SQLite file under the state directory.

It holds every deploy, the last known good unit of each host, and every bench result
(`bench_results`).

The schema is versioned (PRAGMA user_version, migrations in order). WAL and a busy timeout let two
orchestrator processes write at once. Commands that only read open it read-only, and never migrate
it.

A ledger that cannot be used is a StateError naming the file and what to do. That covers a ledger
that is corrupt, a directory, newer or half-migrated, or not writable. A row whose value does not fit
its column (text in a number column, edited by hand) is skipped by every read, with a note naming it.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import StateError, short_path, state_dir_error
from orchestrator.paths import state_dir

BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another one before giving up

MIGRATIONS = [
    """
    CREATE TABLE deploys (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        time REAL NOT NULL,
        host TEXT NOT NULL,
        unit_name TEXT NOT NULL,
        profile TEXT NOT NULL,
        digest TEXT NOT NULL,
        action TEXT NOT NULL,          -- deploy, rollback
        result TEXT NOT NULL,          -- healthy, unchanged, failed
        restarted INTEGER NOT NULL,
        duration_s REAL NOT NULL,
        diagnosis TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX deploys_host_time ON deploys (host, time);
    CREATE TABLE last_good (
        host TEXT NOT NULL,
        unit_name TEXT NOT NULL,
        profile TEXT NOT NULL,
        digest TEXT NOT NULL,
        unit TEXT NOT NULL,
        time REAL NOT NULL,
        PRIMARY KEY (host, unit_name)
    );
    CREATE TABLE good_units (
        host TEXT NOT NULL,
        unit_name TEXT NOT NULL,
        profile TEXT NOT NULL,
        digest TEXT NOT NULL,
        unit TEXT NOT NULL,
        time REAL NOT NULL,
        PRIMARY KEY (host, unit_name, profile)
    );
    """,
    # 2: bench and sweep results. A row is one bench run, or one profile a sweep could not
    # start (result 'failed', metrics NULL, diagnosis set), so the ledger shows both.
    """
    CREATE TABLE bench_results (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        sweep_id TEXT NOT NULL DEFAULT '',
        time REAL NOT NULL,
        host TEXT NOT NULL,
        address TEXT NOT NULL DEFAULT '',
        port INTEGER,
        profile TEXT NOT NULL,
        digest TEXT NOT NULL DEFAULT '',       -- of the unit that served the requests
        plan_digest TEXT NOT NULL DEFAULT '',  -- of --profile's plan, when given
        speculative INTEGER NOT NULL DEFAULT 0,
        sglang_version TEXT NOT NULL DEFAULT '',
        git_commit TEXT NOT NULL DEFAULT 'unknown',
        result TEXT NOT NULL,                  -- ok, failed
        diagnosis TEXT NOT NULL DEFAULT '',
        requests INTEGER NOT NULL DEFAULT 0,
        concurrency INTEGER NOT NULL DEFAULT 0,
        max_tokens INTEGER NOT NULL DEFAULT 0,
        errors INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        duration_s REAL,
        tok_s REAL,                            -- mean per-request decode speed
        tok_s_p50 REAL,
        tok_s_min REAL,
        tok_s_max REAL,
        total_tok_s REAL,                      -- all output tokens over the measured wall time
        ttft_mean_s REAL,
        ttft_p50_s REAL,
        ttft_p90_s REAL,
        ttft_p99_s REAL,
        itl_mean_s REAL,
        itl_p50_s REAL,
        itl_p90_s REAL,
        itl_p99_s REAL,
        accept_len REAL,                       -- /get_server_info internal_states
        accept_len_log REAL,                   -- mean of the server log's `accept len` lines
        accept_len_client REAL,                -- completion tokens over spec_verify_ct
        notes TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX bench_profile_time ON bench_results (profile, time)
    """,
    # 3: what a good unit means (playvars.UnitFacts as JSON: port, bind, GPUs, health URL, rank),
    # kept with it so a rollback never reads them back out of the unit text. Rows recorded
    # before this keep '{}': rolling back to one of them says so.
    """
    ALTER TABLE last_good ADD COLUMN facts TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE good_units ADD COLUMN facts TEXT NOT NULL DEFAULT '{}'
    """,
    # 4: the traffic a bench row measured (endpoint, dataset, load, sampling), so results compare
    # like with like; one bench or sweep run's levels and repeats share a curve_id. Rows from
    # before keep generate, the built-in prompts ('' dataset), temperature 0, closed loop.
    """
    ALTER TABLE bench_results ADD COLUMN endpoint TEXT NOT NULL DEFAULT 'generate';
    ALTER TABLE bench_results ADD COLUMN dataset TEXT NOT NULL DEFAULT '';
    ALTER TABLE bench_results ADD COLUMN dataset_digest TEXT NOT NULL DEFAULT '';
    ALTER TABLE bench_results ADD COLUMN request_rate REAL;
    ALTER TABLE bench_results ADD COLUMN temperature REAL NOT NULL DEFAULT 0;
    ALTER TABLE bench_results ADD COLUMN seed INTEGER;
    ALTER TABLE bench_results ADD COLUMN curve_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE bench_results ADD COLUMN repeat INTEGER NOT NULL DEFAULT 0
    """,
    # 5: tuning campaigns (tune): the space file as read, its hosts and lock, and each trial
    # that finished (a baseline per host, a point of the space, or a leader's extra runs); the
    # trials' bench runs are bench_results rows whose sweep_id is the campaign's id.
    """
    CREATE TABLE campaigns (
        id TEXT PRIMARY KEY,
        time REAL NOT NULL,
        space_path TEXT NOT NULL,
        space_digest TEXT NOT NULL,
        space TEXT NOT NULL,
        hosts TEXT NOT NULL,                   -- JSON list of host names
        status TEXT NOT NULL,                  -- running, interrupted, done
        outcome TEXT NOT NULL DEFAULT '{}'     -- JSON: the verdict and the winner
    );
    CREATE TABLE trials (
        id INTEGER PRIMARY KEY,
        campaign_id TEXT NOT NULL,
        time REAL NOT NULL,
        number INTEGER NOT NULL,               -- the search's trial number (-1: a baseline)
        kind TEXT NOT NULL,                    -- baseline, trial, confirm
        point TEXT NOT NULL,                   -- JSON of the varied fields' values
        profile TEXT NOT NULL,
        host TEXT NOT NULL,
        state TEXT NOT NULL,                   -- complete, stopped, failed, infeasible
        value REAL,                            -- the objective as a ratio to the host's baseline
        restarted INTEGER NOT NULL DEFAULT 1,
        diagnosis TEXT NOT NULL DEFAULT '',
        curve_id TEXT NOT NULL DEFAULT ''      -- its bench_results rows' curve_id
    );
    CREATE INDEX trials_campaign ON trials (campaign_id, id)
    """,
    """
    ALTER TABLE deploys ADD COLUMN model TEXT NOT NULL DEFAULT '';      -- the target model's path
    ALTER TABLE deploys ADD COLUMN phases TEXT NOT NULL DEFAULT '[]';   -- JSON [{phase, s}] of the start
    """,
    # 7: what the campaign's model predicted for a trial before it was measured (its error is
    # reported); NULL for a trial the model did not choose.
    """
    ALTER TABLE trials ADD COLUMN predicted REAL
    """,
    # 8: the files a start read (the model's and drafter's digests), so that results never mix two
    # checkpoints; and its GPU memory, predicted before the stop and measured from the server's log.
    """
    ALTER TABLE deploys ADD COLUMN model_digest TEXT NOT NULL DEFAULT '';
    ALTER TABLE deploys ADD COLUMN memory TEXT NOT NULL DEFAULT '{}';   -- JSON {predicted, measured}
    ALTER TABLE bench_results ADD COLUMN model_digest TEXT NOT NULL DEFAULT ''
    """,
    # 9: servers started by hand that `adopt` wrote a profile for: the next deploy of that unit on
    # that host stops the process (known by PID and start time) and starts the unit.
    """
    CREATE TABLE adoptions (
        id INTEGER PRIMARY KEY,
        time REAL NOT NULL,
        host TEXT NOT NULL,
        unit_name TEXT NOT NULL,
        profile TEXT NOT NULL,
        pid INTEGER NOT NULL,
        start_ticks INTEGER NOT NULL,          -- /proc/PID/stat field 22: the PID's identity
        port INTEGER NOT NULL,
        command TEXT NOT NULL DEFAULT '{}',    -- JSON {argv, cwd, user, log}, secrets redacted
        state TEXT NOT NULL                    -- pending, taken, relaunched, gone
    );
    CREATE INDEX adoptions_host ON adoptions (host, unit_name, id)
    """,
]


def path() -> Path:
    return state_dir() / "ledger.sqlite"


@contextmanager
def connect(db: Path | None = None) -> Iterator[sqlite3.Connection]:
    """A connection for writing, with the schema migrated; commits on success."""
    db = db or path()
    _make_dir(db.parent)
    _check_file(db)
    with _explained(db, writing=True):
        conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S)
        conn.row_factory = sqlite3.Row
        try:
            _use_wal(conn)
            _migrate(conn, db)
            yield conn
            conn.commit()
        finally:
            conn.close()


@contextmanager
def _reading(db: Path | None = None) -> Iterator[sqlite3.Connection | None]:
    """A read-only connection, or None while there is no ledger yet.

    It never creates the file, migrates or switches the journal mode, so `history`, `results` and
    a rollback's look-up work on a ledger this user may only read (another user's, a backup, a
    read-only mount). An older schema is read as it is; a write command migrates it.
    """
    db = db or path()
    _check_dir(db.parent)
    if not db.exists():
        yield None
        return
    _check_file(db)
    with _explained(db, writing=False):
        conn = _open_read_only(db)
        try:
            _check_schema(conn, _version(conn, db), db)
            yield conn
        finally:
            conn.close()


def _open_read_only(db: Path) -> sqlite3.Connection:
    """`mode=ro`, or `immutable=1` where that cannot open the ledger and nothing is lost by it.

    Reading a WAL ledger takes its -shm file, which a reader creates beside it; in a folder this
    user may not write, `mode=ro` fails (SQLITE_CANTOPEN). `immutable=1` reads without one but
    also skips the -wal, so it is used only when no -wal holds writes not yet merged into the file
    (the last writer to close merges them and removes it). Where the folder can be written, a
    reader leaves an empty -wal and the -shm there, as any SQLite reader of a WAL file does.
    """
    uri = db.resolve().as_uri()
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
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
        conn = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True)
    conn.row_factory = sqlite3.Row
    # Text that is not UTF-8 (a hand edit) reaches _unreadable_because as lone surrogates, instead
    # of sqlite3's "Could not decode to UTF-8" on the whole query.
    conn.text_factory = lambda raw: raw.decode("utf-8", "surrogateescape")
    return conn


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
        raise StateError(f"{db} is {kind}, not a ledger: {_move_aside(db)}")


def _move_aside(db: Path) -> str:
    return f"move it aside (mv {db} {db}.broken) and the next command that records starts an empty ledger"


#: SQLite's errors about the file rather than the query (extended codes start with these).
_CORRUPT = ("SQLITE_NOTADB", "SQLITE_CORRUPT")
_NO_ACCESS = ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_IOERR", "SQLITE_FULL")


@contextmanager
def _explained(db: Path, writing: bool) -> Iterator[None]:
    """SQLite's errors about the ledger file as a StateError naming it and what to do."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        name = getattr(e, "sqlite_errorname", "")
        if name.startswith(_CORRUPT):
            raise StateError(f"{db} is not a readable ledger ({e}): {_move_aside(db)}") from e
        if name.startswith(_NO_ACCESS):
            done, do = ("written", "write") if writing else ("read", "read")
            raise StateError(
                f"{db} cannot be {done} ({e}): let this user {do} it and {db.parent}, "
                "or point ORCHESTRATOR_STATE_DIR at another directory"
            ) from e
        raise


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


def _migrate(conn: sqlite3.Connection, db: Path) -> None:
    version = _version(conn, db)
    _check_schema(conn, version, db)
    if version == len(MIGRATIONS):
        return
    conn.execute("BEGIN IMMEDIATE")  # one writer migrates; the other waits, then sees the new version
    version = _version(conn, db)
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        try:
            for statement in filter(str.strip, script.split(";")):
                conn.execute(statement)
        except sqlite3.OperationalError as e:  # a table or column of a later version already there
            raise _half_migrated(db, version, f"migration {number} fails: {e}") from e
        conn.execute(f"PRAGMA user_version={number}")
    conn.commit()


def _version(conn: sqlite3.Connection, db: Path) -> int:
    """The schema version (PRAGMA user_version), refused when newer than this code knows."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > len(MIGRATIONS):
        raise StateError(
            f"{db} has schema version {version}, newer than this orchestrator knows "
            f"({len(MIGRATIONS)}): a newer orchestrator wrote it; use that one, or point "
            "ORCHESTRATOR_STATE_DIR at another directory"
        )
    return version


def _check_schema(conn: sqlite3.Connection, version: int, db: Path) -> None:
    """Every table and column the first `version` migrations make is there."""
    have = _columns(conn)
    wrong = []
    for table, columns in sorted(_expected_columns(version).items()):
        if table not in have:
            wrong.append(f"table {table} is missing")
        elif missing := sorted(columns - have[table]):
            wrong.append(f"{table} lacks {', '.join(missing)}")
    if wrong:
        raise _half_migrated(db, version, "; ".join(wrong))


def _half_migrated(db: Path, version: int, what: str) -> StateError:
    return StateError(f"{db} is half-migrated (schema version {version}, but {what}): {_move_aside(db)}")


def _columns(conn: sqlite3.Connection) -> dict[str, frozenset[str]]:
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {
        t: frozenset(r[0] for r in conn.execute("SELECT name FROM pragma_table_info(?)", (t,)))
        for t in tables
    }


@functools.cache
def _expected_columns(version: int) -> dict[str, frozenset[str]]:
    """The tables and columns after the first `version` migrations."""
    return {table: frozenset(columns) for table, columns in _column_types(version).items()}


def _select(
    table: str,
    query: str | Callable[[frozenset[str]], str],
    args: Sequence[Any] = (),
    db: Path | None = None,
) -> list[sqlite3.Row]:
    """The rows of a read-only query on `table`: none while the ledger does not exist, or is of
    an older schema that has no such table yet (a ledger from before bench holds no results).
    `query` may be made from the columns the table has in this ledger (its schema's version).
    A row with a value its column cannot hold is left out, and noted (take_unreadable)."""
    with _reading(db) as conn:
        if conn is None:
            return []
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone():
            return []
        if callable(query):
            have = frozenset(r[0] for r in conn.execute("SELECT name FROM pragma_table_info(?)", (table,)))
            query = query(have)
        rows = conn.execute(query, args).fetchall()
    readable = []
    for row in rows:
        problem = _unreadable_because(table, row)
        if problem is None:
            readable.append(row)
        else:
            _unreadable.append(
                f"ledger {short_path(db or path())}: {table} row {_row_name(table, row)}: "
                f"{problem}; the row is skipped (correct or delete it)"
            )
    return readable


#: Notes on the rows reads have skipped, for the CLI to print (console.handle_errors): one
#: place for every reader (history, results, a bench's standing, a sweep, a rollback's choice).
_unreadable: list[str] = []


def take_unreadable() -> list[str]:
    """The notes on rows skipped since the last call, each once, and forgets them."""
    notes = list(dict.fromkeys(_unreadable))
    _unreadable.clear()
    return notes


#: The largest number any column holds as this code writes it (times, counts, tok/s, seconds):
#: a bound on hand edits such as 1e308, which no sum, mean or plot axis survives.
LARGEST = 1e15
#: 9999-12-31 23:59:59 UTC: the last second a date can show.
LAST_TIME = 253402300799.0


def _unreadable_because(table: str, row: sqlite3.Row) -> str | None:
    """Why `row` cannot be used as its table's schema says (its first bad column), or None."""
    types = _column_types(len(MIGRATIONS)).get(table, {})
    for column, value in zip(row.keys(), tuple(row), strict=True):  # iterating a Row gives its values
        if column not in types:
            continue
        kind, required = types[column]
        if value is None:
            if required:
                return f"{column} is empty (NULL)"
            continue
        problem = _value_problem(column, kind, value)
        if problem:
            return f"{column} holds {_shown(value)}, {problem}"
    return None


def _value_problem(column: str, kind: str, value: Any) -> str:
    """What is wrong with one non-NULL value of a column of type `kind` ("" if nothing)."""
    if kind == "TEXT":
        if not isinstance(value, str):
            return "not text"
        if any("\udc80" <= ch <= "\udcff" for ch in value):
            return "not UTF-8 text"
        if column == "facts" and not _json_object(value):
            return "not a JSON object"
        return ""
    if not isinstance(value, (int, float)):
        return "not a number"
    if kind == "INTEGER" and not isinstance(value, int):
        return "not a whole number"
    if not (math.isfinite(value) and abs(value) <= LARGEST):
        return f"out of range (largest {LARGEST:g})"
    if column == "time" and not 0 <= value <= LAST_TIME:
        return "not a time (seconds since 1970, before the year 10000)"
    return ""


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _shown(value: Any, limit: int = 40) -> str:
    """repr() of a value for a note, cut short."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def _row_name(table: str, row: sqlite3.Row | dict[str, Any]) -> str:
    """`id 7`, or the key of a table without an id (last_good: host and unit)."""
    keys = row.keys()
    if "id" in keys:
        return f"id {row['id']}"
    named = [f"{k}={_shown(row[k])}" for k in ("host", "unit_name", "profile") if k in keys]
    if table == "last_good":
        named = named[:2]
    return " ".join(named)


@functools.cache
def _columns_as_made(version: int) -> dict[str, list[tuple[str, str, bool, str | None]]]:
    """Per table, each column's (name, declared type, NOT NULL, DEFAULT as SQL text or None),
    after the first `version` migrations, from running them in memory."""
    conn = sqlite3.connect(":memory:")
    try:
        for script in MIGRATIONS[:version]:
            conn.executescript(script)
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        query = 'SELECT name, type, "notnull", dflt_value FROM pragma_table_info(?)'
        return {
            t: [
                (name, kind, bool(notnull), default)
                for name, kind, notnull, default in conn.execute(query, (t,))
            ]
            for t in tables
        }
    finally:
        conn.close()


@functools.cache
def _column_types(version: int) -> dict[str, dict[str, tuple[str, bool]]]:
    """Per table, each column's declared type and whether it is NOT NULL."""
    return {
        t: {name: (kind.upper(), notnull) for name, kind, notnull, _ in columns}
        for t, columns in _columns_as_made(version).items()
    }


@dataclass(frozen=True)
class DeployRow:
    run_id: str
    host: str
    unit_name: str
    profile: str
    digest: str
    action: str
    result: str
    restarted: bool
    duration_s: float
    diagnosis: str = ""
    model: str = ""
    #: The start's phases, [{phase, s}] (startup_watch.PHASES), when the server was started.
    phases: list[dict[str, Any]] = field(default_factory=list)
    #: The model's and drafter's files (host_report.model_digest); "" where not scanned.
    model_digest: str = ""
    #: GPU memory of the start: {predicted, measured} (HostReport.memory).
    memory: dict[str, Any] = field(default_factory=dict)


def record_deploy(row: DeployRow, good_unit: str | None = None, facts: dict[str, Any] | None = None) -> None:
    """Append a deploy; a healthy one's unit (and its facts) becomes the host's last known good."""
    now = time.time()
    with connect() as conn:
        conn.execute(
            "INSERT INTO deploys (run_id, time, host, unit_name, profile, digest, action, result, restarted,"
            " duration_s, diagnosis, model, phases, model_digest, memory)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                row.run_id,
                now,
                row.host,
                row.unit_name,
                row.profile,
                row.digest,
                row.action,
                row.result,
                int(row.restarted),
                row.duration_s,
                row.diagnosis,
                row.model,
                json.dumps(row.phases),
                row.model_digest,
                json.dumps(row.memory),
            ),
        )
        if good_unit is not None:
            values = (
                row.host,
                row.unit_name,
                row.profile,
                row.digest,
                good_unit,
                now,
                json.dumps(facts or {}),
            )
            names = "(host, unit_name, profile, digest, unit, time, facts)"
            conn.execute(f"INSERT OR REPLACE INTO last_good {names} VALUES (?,?,?,?,?,?,?)", values)
            conn.execute(f"INSERT OR REPLACE INTO good_units {names} VALUES (?,?,?,?,?,?,?)", values)


def _good(row: sqlite3.Row | None) -> dict[str, Any] | None:
    """A good-unit row as a record: profile, digest, unit, time and its facts (a dict)."""
    if row is None:
        return None
    record = dict(row)
    record["facts"] = json.loads(record.get("facts") or "{}")
    return record


def good_unit(host: str, unit_name: str, profile: str | None = None) -> dict[str, Any] | None:
    """The last healthy unit of `host` (of `profile`, when given)."""
    if profile is None:
        query = "SELECT * FROM last_good WHERE host=? AND unit_name=?"
        return _good(next(iter(_select("last_good", query, (host, unit_name))), None))
    query = "SELECT * FROM good_units WHERE host=? AND unit_name=? AND profile=?"
    return _good(next(iter(_select("good_units", query, (host, unit_name, profile))), None))


def previous_good(host: str, unit_name: str, current_digest: str) -> dict[str, Any] | None:
    """The most recent healthy unit of `host` other than the one it runs now (a row that cannot be
    read is passed over for the one before it)."""
    query = "SELECT * FROM good_units WHERE host=? AND unit_name=? AND digest!=? ORDER BY time DESC"
    return _good(next(iter(_select("good_units", query, (host, unit_name, current_digest))), None))


def starts(host: str, model: str, limit: int = 5) -> list[list[dict[str, Any]]]:
    """The phases ([{phase, s}]) of the last `limit` healthy starts of `model` on `host`, newest first
    (a phase a hand edit broke is left out, with a note: deploy_phases)."""
    query = (
        "SELECT id, phases FROM deploys WHERE host=? AND model=? AND result='healthy' AND phases!='[]' "
        "ORDER BY time DESC, id DESC LIMIT ?"
    )
    # A ledger of before start-up phases (read, not migrated, here) has none.
    rows = _select(
        "deploys",
        lambda have: query if "phases" in have else "SELECT 0 AS id, '[]' AS phases WHERE 0 AND ?||?||?",
        (host, model, limit),
    )
    return [found for found in (deploy_phases(dict(r)) for r in rows) if found]


def measured_memory(host: str, model: str, limit: int = 20) -> list[dict[str, Any]]:
    """The GPU memory of the last healthy starts of `model` on `host`, newest first: each start's
    {predicted, measured} (HostReport.memory) where the server logged its figures, with the
    `model_digest` of the files it read. A value a hand edit broke is passed over."""
    query = (
        "SELECT memory, model_digest FROM deploys WHERE host=? AND model=? AND result='healthy' "
        "AND memory!='{}' ORDER BY time DESC, id DESC LIMIT ?"
    )
    rows = _select(
        "deploys",
        lambda have: (
            query if "memory" in have else "SELECT '{}' AS memory, '' AS model_digest WHERE ?||?||? AND 0"
        ),
        (host, model, limit),
    )
    found = []
    for r in rows:
        try:
            memory = json.loads(r["memory"] or "{}")
        except ValueError:
            continue
        if isinstance(memory, dict) and isinstance(memory.get("measured"), dict):
            found.append({**memory, "model_digest": r["model_digest"]})
    return found


def model_digest_of(host: str, unit_digest: str, db: Path | None = None) -> str:
    """The files the newest healthy start of this unit text on `host` read; "" when not known."""
    query = (
        "SELECT model_digest FROM deploys WHERE host=? AND digest=? AND result='healthy' "
        "AND model_digest!='' ORDER BY time DESC, id DESC LIMIT 1"
    )
    rows = _select(
        "deploys",
        lambda have: query if "model_digest" in have else "SELECT '' AS model_digest WHERE 0 AND ?||?",
        (host, unit_digest),
        db,
    )
    return str(rows[0]["model_digest"]) if rows else ""


def deploy_phases(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A deploys row's start-up phases, [{phase, s}], as plain JSON values.

    The column is JSON text, which a hand edit can break: text that is not a JSON list, a phase
    without a name, a duration that is not a number of seconds from 0 to LARGEST (NaN, 1e999). Such
    a value is left out, and noted (take_unreadable), as a row that does not fit its table is.
    """
    text = row.get("phases", "[]")  # a ledger of before start-up phases has none
    try:
        data = json.loads(text or "[]")
    except ValueError:
        data = None
    if not isinstance(data, list):
        _note_phases(row, f"phases holds {_shown(text)}, not a JSON list", "value")
        return []
    found = []
    for item in data:
        problem = _phase_problem(item)
        if problem:
            _note_phases(row, f"phases holds {_shown(item, 60)}, {problem}", "phase")
        else:
            found.append({"phase": item["phase"], "s": float(item["s"])})
    return found


def _phase_problem(item: Any) -> str:
    """What is wrong with one entry of a deploys row's phases ("" if nothing)."""
    if not isinstance(item, dict) or not isinstance(item.get("phase"), str):
        return "not a phase ({phase: name, s: seconds})"
    seconds = item.get("s")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return "its s is not a number"
    if math.isnan(seconds):
        return "its s is NaN, not a number of seconds"
    if not (math.isfinite(seconds) and 0 <= seconds <= LARGEST):
        return f"its s is out of range (0 to {LARGEST:g} seconds)"
    return ""


def _note_phases(row: dict[str, Any], problem: str, what: str) -> None:
    _unreadable.append(
        f"ledger {short_path(path())}: deploys row {_row_name('deploys', row)}: {problem}; "
        f"the {what} is skipped (correct or delete it)"
    )


def history(host: str | None = None, limit: int = 50) -> list[sqlite3.Row]:
    if host:
        query = "SELECT * FROM deploys WHERE host=? ORDER BY time DESC, id DESC LIMIT ?"
        return _select("deploys", query, (host, limit))
    return _select("deploys", "SELECT * FROM deploys ORDER BY time DESC, id DESC LIMIT ?", (limit,))


#: bench_results columns a caller fills (id is SQLite's).
BENCH_COLUMNS = [
    "run_id",
    "sweep_id",
    "time",
    "host",
    "address",
    "port",
    "profile",
    "digest",
    "plan_digest",
    "speculative",
    "sglang_version",
    "git_commit",
    "result",
    "diagnosis",
    "requests",
    "concurrency",
    "max_tokens",
    "errors",
    "output_tokens",
    "duration_s",
    "tok_s",
    "tok_s_p50",
    "tok_s_min",
    "tok_s_max",
    "total_tok_s",
    "ttft_mean_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "itl_mean_s",
    "itl_p50_s",
    "itl_p90_s",
    "itl_p99_s",
    "accept_len",
    "accept_len_log",
    "accept_len_client",
    "notes",
    "endpoint",
    "dataset",
    "dataset_digest",
    "request_rate",
    "temperature",
    "seed",
    "curve_id",
    "repeat",
    "model_digest",
]


def record_bench(row: dict[str, Any], db: Path | None = None) -> int:
    """Append one bench result (keys from BENCH_COLUMNS; missing ones take the column default)."""
    unknown = set(row) - set(BENCH_COLUMNS)
    if unknown:
        raise ValueError(f"not bench_results columns: {sorted(unknown)}")
    if not row.get("model_digest") and row.get("host") and row.get("digest"):
        # The files the server it measured was started with, as its deploy recorded them.
        row = {**row, "model_digest": model_digest_of(str(row["host"]), str(row["digest"]), db)}
    return _insert("bench_results", row, db)


def _insert(table: str, row: dict[str, Any], db: Path | None = None) -> int:
    """Append `row` (time: now unless given) to `table`; its id."""
    values = {"time": time.time(), **row}
    names = ", ".join(values)
    marks = ",".join("?" * len(values))
    with connect(db) as conn:
        cur = conn.execute(f"INSERT INTO {table} ({names}) VALUES ({marks})", tuple(values.values()))
        return int(cur.lastrowid or 0)


def bench_results(
    profile: str | None = None,
    since: float | None = None,
    db: Path | None = None,
    *,
    endpoint: str | None = None,
    dataset: str | None = None,
    concurrency: int | None = None,
    request_rate: float | None = None,
    temperature: float | None = None,
    seed: int | None = None,
) -> list[sqlite3.Row]:
    """Bench rows oldest first, each filter (when given) narrowing them: one profile, from a time
    (epoch seconds) on, one endpoint, one dataset (its name, its digest, or six or more leading
    characters of the digest), concurrency, request rate, temperature, seed.

    A ledger of an older schema, read as it is, shows its rows with the newer columns' defaults
    (endpoint generate, ...), so every reader and filter sees one set of columns.
    """
    where: list[str] = []
    args: list[Any] = []
    for column, value in (("profile", profile or None), ("endpoint", endpoint), ("concurrency", concurrency)):
        if value is not None:
            where, args = [*where, f"{column}=?"], [*args, value]
    if since is not None:
        where, args = [*where, "time>=?"], [*args, since]
    if dataset is not None:
        prefix = "(length(?)>=6 AND substr(dataset_digest, 1, length(?))=?)"
        where, args = [*where, f"(dataset=? OR dataset_digest=? OR {prefix})"], [*args, *[dataset] * 5]
    for column, number in (("request_rate", request_rate), ("temperature", temperature)):
        if number is not None:  # REAL columns: as the same float the bench parsed, give or take rounding
            where, args = [*where, f"abs({column}-?)<=1e-9*max(1.0, abs(?))"], [*args, number, number]
    if seed is not None:
        where, args = [*where, "seed=?"], [*args, seed]

    def query(have: frozenset[str]) -> str:
        return f"SELECT * FROM ({_bench_select(have)}) WHERE {' AND '.join(where) or '1=1'} ORDER BY time, id"

    return _select("bench_results", query, args, db)


def _bench_select(have: frozenset[str]) -> str:
    """bench_results with the columns a ledger of an older schema lacks, as their defaults."""
    defaults = _column_defaults(len(MIGRATIONS))["bench_results"]
    missing = [c for c in _column_types(len(MIGRATIONS))["bench_results"] if c not in have]
    added = "".join(f', {defaults[c] or "NULL"} AS "{c}"' for c in missing)
    return f"SELECT *{added} FROM bench_results"


@functools.cache
def _column_defaults(version: int) -> dict[str, dict[str, str | None]]:
    """Per table, each column's DEFAULT as SQL text (None if it has none)."""
    return {
        t: {name: default for name, _, _, default in columns}
        for t, columns in _columns_as_made(version).items()
    }


def to_csv(rows: list[sqlite3.Row] | list[dict[str, Any]]) -> str:
    """Rows as CSV with a header: every column, so a spreadsheet gets all the ledger knows."""
    buf = io.StringIO()
    if not rows:
        return ""
    names = list(rows[0].keys())
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(names)
    for r in rows:
        writer.writerow(["" if r[n] is None else r[n] for n in names])
    return buf.getvalue()


# --- tuning campaigns -------------------------------------------------------------------------


def record_campaign(row: dict[str, Any]) -> None:
    """A new campaign (campaigns columns but outcome)."""
    _insert("campaigns", row)


def update_campaign(campaign_id: str, **changes: Any) -> None:
    """Set a campaign's status, hosts or outcome."""
    with connect() as conn:
        sets = ", ".join(f"{k}=?" for k in changes)
        conn.execute(f"UPDATE campaigns SET {sets} WHERE id=?", (*changes.values(), campaign_id))


def campaign(campaign_id: str) -> sqlite3.Row | None:
    rows = _select("campaigns", "SELECT * FROM campaigns WHERE id=?", (campaign_id,))
    return rows[0] if rows else None


def record_trial(row: dict[str, Any]) -> None:
    """One finished trial of a campaign (trials columns but id)."""
    _insert("trials", row)


def trials(campaign_id: str) -> list[sqlite3.Row]:
    """A campaign's finished trials, oldest first."""
    return _select("trials", "SELECT * FROM trials WHERE campaign_id=? ORDER BY id", (campaign_id,))


def note_skipped(table: str, row: sqlite3.Row | dict[str, Any], problem: str) -> None:
    """Skip a row whose values pass their column's type but not what a reader needs of them (a
    campaign's hosts, a trial's point), with the same note as a row of a bad type."""
    _unreadable.append(
        f"ledger {short_path(path())}: {table} row {_row_name(table, row)}: {problem}; "
        "the row is skipped (correct or delete it)"
    )


def update_bench(row_id: int, **changes: Any) -> None:
    """Set columns of one bench row: a tune trial reads the server log once, after its runs are
    in, and fills their accept lengths and notes then."""
    unknown = set(changes) - set(BENCH_COLUMNS)
    if unknown:
        raise ValueError(f"not bench_results columns: {sorted(unknown)}")
    with connect() as conn:
        sets = ", ".join(f"{k}=?" for k in changes)
        conn.execute(f"UPDATE bench_results SET {sets} WHERE id=?", (*changes.values(), row_id))


def record_adoption(row: dict[str, Any]) -> int:
    """A hand-started server `adopt` wrote a profile for (adoptions columns but id); its id."""
    return _insert("adoptions", row)


def pending_adoption(host: str, unit_name: str) -> sqlite3.Row | None:
    """The newest adoption of `unit_name` on `host` that no deploy has taken over yet."""
    rows = _select(
        "adoptions",
        "SELECT * FROM adoptions WHERE host=? AND unit_name=? ORDER BY id DESC LIMIT 1",
        (host, unit_name),
    )
    return rows[0] if rows and rows[0]["state"] == "pending" else None


def update_adoption(adoption_id: int, state: str) -> None:
    """What became of an adoption: taken (the unit runs), relaunched (the unit failed and the hand
    command runs again), gone (the process had ended before the deploy)."""
    with connect() as conn:
        conn.execute("UPDATE adoptions SET state=? WHERE id=?", (state, adoption_id))
