"""The local ledger: one SQLite file under the state directory with every deploy and the
last known good unit of each host, and every bench result (`bench_results`).

Versioned schema (PRAGMA user_version, migrations in order), WAL and a busy timeout so
two orchestrator processes can write at once.
"""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    # 3: what a good unit means (hostplan.UnitFacts as JSON: port, bind, GPUs, health URL, rank),
    # kept with it so a rollback never reads them back out of the unit text. Rows recorded
    # before this keep '{}': rolling back to one of them says so.
    """
    ALTER TABLE last_good ADD COLUMN facts TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE good_units ADD COLUMN facts TEXT NOT NULL DEFAULT '{}'
    """,
]


def path() -> Path:
    return state_dir() / "ledger.sqlite"


@contextmanager
def connect(db: Path | None = None) -> Iterator[sqlite3.Connection]:
    """A connection with the schema migrated; commits on success."""
    db = db or path()
    db.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S)
    conn.row_factory = sqlite3.Row
    try:
        _use_wal(conn)
        _migrate(conn)
        yield conn
        conn.commit()
    finally:
        conn.close()


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


def _migrate(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version >= len(MIGRATIONS):
        return
    conn.execute("BEGIN IMMEDIATE")  # one writer migrates; the other waits, then sees the new version
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        for statement in filter(str.strip, script.split(";")):
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version={number}")
    conn.commit()


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


def record_deploy(row: DeployRow, good_unit: str | None = None, facts: dict[str, Any] | None = None) -> None:
    """Append a deploy; a healthy one's unit (and its facts) becomes the host's last known good."""
    now = time.time()
    with connect() as conn:
        conn.execute(
            "INSERT INTO deploys (run_id, time, host, unit_name, profile, digest, action, result, restarted,"
            " duration_s, diagnosis) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
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
    with connect() as conn:
        if profile is None:
            query = "SELECT * FROM last_good WHERE host=? AND unit_name=?"
            return _good(conn.execute(query, (host, unit_name)).fetchone())
        query = "SELECT * FROM good_units WHERE host=? AND unit_name=? AND profile=?"
        return _good(conn.execute(query, (host, unit_name, profile)).fetchone())


def previous_good(host: str, unit_name: str, current_digest: str) -> dict[str, Any] | None:
    """The most recent healthy unit of `host` other than the one it runs now."""
    with connect() as conn:
        query = (
            "SELECT * FROM good_units WHERE host=? AND unit_name=? AND digest!=? ORDER BY time DESC LIMIT 1"
        )
        return _good(conn.execute(query, (host, unit_name, current_digest)).fetchone())


def history(host: str | None = None, limit: int = 50) -> list[sqlite3.Row]:
    with connect() as conn:
        if host:
            query = "SELECT * FROM deploys WHERE host=? ORDER BY time DESC, id DESC LIMIT ?"
            return conn.execute(query, (host, limit)).fetchall()
        return conn.execute("SELECT * FROM deploys ORDER BY time DESC, id DESC LIMIT ?", (limit,)).fetchall()


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
]


def record_bench(row: dict[str, Any], db: Path | None = None) -> int:
    """Append one bench result (keys from BENCH_COLUMNS; missing ones take the column default)."""
    unknown = set(row) - set(BENCH_COLUMNS)
    if unknown:
        raise ValueError(f"not bench_results columns: {sorted(unknown)}")
    values = {"time": time.time(), **row}
    names = ", ".join(values)
    marks = ",".join("?" * len(values))
    with connect(db) as conn:
        cur = conn.execute(f"INSERT INTO bench_results ({names}) VALUES ({marks})", tuple(values.values()))
        return int(cur.lastrowid or 0)


def bench_results(
    profile: str | None = None, since: float | None = None, db: Path | None = None
) -> list[sqlite3.Row]:
    """Bench rows oldest first, optionally of one profile and from a time (epoch seconds) on."""
    query, args = "SELECT * FROM bench_results WHERE 1=1", []
    if profile:
        query, args = query + " AND profile=?", [*args, profile]
    if since is not None:
        query, args = query + " AND time>=?", [*args, since]
    with connect(db) as conn:
        return conn.execute(query + " ORDER BY time, id", args).fetchall()


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
