"""A team's ledger: what `ledger status` reports, and `ledger push` (a SQLite ledger copied into
a shared one).

A push copies each row once. A row of a logged table (deploys, bench_results, trials, adoptions)
carries where it came from (pushed_from: the source ledger's id and the row's id), which the target
holds once. A campaign is copied once by its id; a good unit where the target's is older. Rows
keep the machine that wrote them (origin); a row written before the ledger knew it gets the
machine that pushes it, which is where a SQLite ledger lives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from orchestrator.errors import StateError
from orchestrator.ledger import _dialect, schema, store

BATCH = 200  # rows per INSERT: under SQLite's 32,766 parameters, at 53 columns


@dataclass
class Status:
    """One ledger, as `ledger status` shows it."""

    ledger: str
    engine: str  # sqlite, postgresql
    source: str  # --ledger, ORCHESTRATOR_LEDGER, the state directory
    exists: bool
    version: int = 0
    newest: int = schema.HEAD
    ledger_id: str = ""
    rows: dict[str, int] = field(default_factory=dict)
    #: control machine -> when it last recorded (epoch seconds)
    machines: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def status(w: store.Where | None = None) -> Status:
    """Which ledger, its schema version and row counts; read only, never migrated."""
    w = w or store.where()
    found = Status(w.shown(), "sqlite" if w.sqlite else "postgresql", w.source, exists=False)
    with store.reading(w) as conn:
        if conn is None:
            return found
        found.exists = True
        found.version = store.version_of(conn, w)
        for table in schema.metadata.sorted_tables:
            if table.name != "ledger_info" and store.has_table(conn, table.name):
                count = conn.execute(sa.text(f"SELECT count(*) FROM {table.name}")).scalar_one()
                found.rows[table.name] = int(count)
        if store.has_table(conn, "ledger_info"):
            for key, value in conn.execute(sa.text("SELECT key, value FROM ledger_info")):
                if key == "ledger_id":
                    found.ledger_id = value
                elif key.startswith("seen:"):
                    found.machines[key.removeprefix("seen:")] = _number(value)
    return found


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


@dataclass
class Pushed:
    """What one push did, per table: rows copied, and rows the target already had."""

    source: str
    target: str
    copied: dict[str, int] = field(default_factory=dict)
    had: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def push(source: Path, target: store.Where) -> Pushed:
    """Copy the SQLite ledger `source` into `target`, each row once (a second push adds nothing)."""
    if target.file is not None and target.file.resolve() == source.resolve():
        raise StateError(f"ledger push: {source} is the ledger it would push into: name another ledger")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", str(source)):  # not echoed: it may hold a password
        raise StateError("ledger push --from takes a SQLite ledger's path, not a URL")
    src = store.Where(sa.URL.create("sqlite"), source, "the ledger to push")
    if not source.is_file():
        raise StateError(f"ledger push: no ledger at {source}: give a SQLite ledger's path with --from")
    with store.writing(src) as conn:  # migrated, so it has an id and every column
        ledger_id = conn.execute(sa.text("SELECT value FROM ledger_info WHERE key='ledger_id'")).scalar_one()
    here = store.origin()
    done = Pushed(src.shown(), target.shown())
    with store.reading(src) as read, store.writing(target) as write:
        assert read is not None
        for table in schema.metadata.sorted_tables:
            if table.name == "ledger_info":
                continue
            copied = seen = 0
            found = read.execution_options(yield_per=BATCH).execute(sa.select(table))
            for part in found.mappings().partitions():  # BATCH rows at a time, never the whole table
                copied += _insert_new(write, table, [_moved(table, dict(r), ledger_id, here) for r in part])
                seen += len(part)
            done.copied[table.name] = copied
            done.had[table.name] = seen - copied
    return done


def _moved(table: sa.Table, row: dict[str, Any], ledger_id: str, here: str) -> dict[str, Any]:
    """A source row as the target gets it."""
    row = dict(row)
    row["origin"] = row.get("origin") or here
    if table.name in schema.LOGGED:
        # The row's id and time: SQLite reuses the id of a deleted newest row, and a copied ledger
        # file shares the id of the ledger it came from; their rows' times differ.
        row["pushed_from"] = row.get("pushed_from") or f"{ledger_id}:{row['id']}@{row['time']!r}"
        row.pop("id", None)
    if table.name == "campaigns":  # nobody runs it in the target yet
        row["holder"], row["heartbeat"] = "", None
    return row


def _insert_new(conn: sa.Connection, table: sa.Table, rows: list[dict[str, Any]]) -> int:
    """Insert the rows the target lacks; how many it took (the rows RETURNING gives back).

    One statement, compiled once, for all the rows: SQLAlchemy sends them in batches itself."""
    if not rows:
        return 0
    stmt = _dialect(conn).insert(table)
    if table.name in schema.LOGGED:
        stmt = stmt.on_conflict_do_nothing(index_elements=["pushed_from"])
    elif table.name == "campaigns":  # one that ended since the last push: its end, unless one runs it
        c = table.c
        ended = sa.or_(c.status != stmt.excluded.status, c.outcome != stmt.excluded.outcome)
        stmt = stmt.on_conflict_do_update(
            index_elements=["id"],
            set_={
                "status": stmt.excluded.status,
                "outcome": stmt.excluded.outcome,
                "hosts": stmt.excluded.hosts,
            },
            where=sa.and_(c.holder == "", ended),
        )
    else:  # a good unit: the newer one stays
        keys = [c.name for c in table.primary_key.columns]
        changed = {c: stmt.excluded[c] for c in rows[0] if c not in keys}
        stmt = stmt.on_conflict_do_update(
            index_elements=keys, set_=changed, where=table.c.time < stmt.excluded.time
        )
    return len(conn.execute(stmt.returning(*table.primary_key.columns), rows).all())
