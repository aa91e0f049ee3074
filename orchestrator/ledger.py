"""The local ledger: one SQLite file under the state directory with every deploy and the
last known good unit of each host (the bench issue adds its results here).

Versioned schema (PRAGMA user_version, migrations in order), WAL and a busy timeout so
two orchestrator processes can write at once.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator.paths import state_dir

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
        result TEXT NOT NULL,          -- healthy, unchanged, failed, rolled-back, rollback-failed
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
]


def path() -> Path:
    return state_dir() / "ledger.sqlite"


@contextmanager
def connect(db: Path | None = None) -> Iterator[sqlite3.Connection]:
    """A connection with the schema migrated; commits on success."""
    db = db or path()
    db.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=30000")
        _migrate(conn)
        yield conn
        conn.commit()
    finally:
        conn.close()


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


def record_deploy(row: DeployRow, good_unit: str | None = None) -> None:
    """Append a deploy; a healthy one's unit becomes the host's last known good."""
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
            values = (row.host, row.unit_name, row.profile, row.digest, good_unit, now)
            conn.execute("INSERT OR REPLACE INTO last_good VALUES (?,?,?,?,?,?)", values)
            conn.execute("INSERT OR REPLACE INTO good_units VALUES (?,?,?,?,?,?)", values)


def good_unit(host: str, unit_name: str, profile: str | None = None) -> sqlite3.Row | None:
    """The last healthy unit of `host` (of `profile`, when given)."""
    with connect() as conn:
        if profile is None:
            query = "SELECT * FROM last_good WHERE host=? AND unit_name=?"
            return conn.execute(query, (host, unit_name)).fetchone()
        query = "SELECT * FROM good_units WHERE host=? AND unit_name=? AND profile=?"
        return conn.execute(query, (host, unit_name, profile)).fetchone()


def previous_good(host: str, unit_name: str, current_digest: str) -> sqlite3.Row | None:
    """The most recent healthy unit of `host` other than the one it runs now."""
    with connect() as conn:
        query = (
            "SELECT * FROM good_units WHERE host=? AND unit_name=? AND digest!=? ORDER BY time DESC LIMIT 1"
        )
        return conn.execute(query, (host, unit_name, current_digest)).fetchone()


def history(host: str | None = None, limit: int = 50) -> list[sqlite3.Row]:
    with connect() as conn:
        if host:
            query = "SELECT * FROM deploys WHERE host=? ORDER BY time DESC, id DESC LIMIT ?"
            return conn.execute(query, (host, limit)).fetchall()
        return conn.execute("SELECT * FROM deploys ORDER BY time DESC, id DESC LIMIT ?", (limit,)).fetchall()
