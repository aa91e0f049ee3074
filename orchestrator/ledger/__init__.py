"""The ledger: the tool's memory. Every deploy, each host's last good unit, every bench result,
every tuning campaign and trial, every adoption.

It is one SQLite file under the state directory (the default), or a PostgreSQL database a team
shares (store.py says which, and how to connect). One schema serves both (schema.py); Alembic
migrates it (migrations/). Commands that only read never migrate it.

A ledger that cannot be used is a StateError naming it and what to do. That covers a ledger that
is corrupt, a directory, newer or half-migrated, unreachable, or not writable. A row whose value
does not fit its column (text in a number column of a SQLite file edited by hand) is skipped by
every read, with a note naming it.

Lives here: store (which ledger, connections, migrating), schema (the tables), team (status, push),
migrations (Alembic's).
May import: the foundation's errors.py and paths.py only.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import getpass
import io
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from orchestrator.errors import StateError, short_path
from orchestrator.ledger import schema, store
from orchestrator.ledger.store import BUSY_TIMEOUT_S, origin, use, where
from orchestrator.paths import state_dir

__all__ = ["BUSY_TIMEOUT_S", "origin", "use", "where"]

#: A row as the ledger gives it: column name to value.
Row = dict[str, Any]


def path() -> Path:
    """The default ledger: the SQLite file in the state directory."""
    return state_dir() / "ledger.sqlite"


def shown() -> str:
    """The ledger in use, for a table's title or a message (a URL's password hidden)."""
    return where().shown()


@contextmanager
def connect(db: Path | None = None) -> Iterator[sa.Connection]:
    """A connection for writing (to the SQLite file `db`, when given), in a transaction, with the
    schema migrated; commits on success."""
    with store.writing(_at(db)) as conn:
        yield conn


def _at(db: Path | None) -> store.Where | None:
    return None if db is None else store.Where(sa.URL.create("sqlite"), db, "the file")


def ready() -> None:
    """Check, before anything on a host changes, that the ledger can record what follows.

    It migrates the schema and writes one row (when this machine last wrote), so an unreachable,
    read-only or newer ledger stops the command here, with one line saying why.
    """
    w = where()
    with store.writing(w) as conn:
        if conn.dialect.name == "postgresql":
            _check_grants(conn, w)
        _upsert(conn, schema.ledger_info, {"key": f"seen:{origin()}", "value": repr(time.time())}, ["key"])


def _check_grants(conn: sa.Connection, w: store.Where) -> None:
    """On PostgreSQL, a role may write one table and not the next: every grant a record needs
    (INSERT and UPDATE on each table, USAGE on each id sequence) is checked at once."""
    query = """
        SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND (
            (c.relkind = 'r' AND c.relname = ANY(:tables)
             AND NOT (has_table_privilege(c.oid, 'INSERT')
                      AND has_table_privilege(c.oid, 'UPDATE')))
            OR (c.relkind = 'S' AND c.relname = ANY(:sequences)
                AND NOT has_sequence_privilege(c.oid, 'USAGE')))
        ORDER BY c.relname
    """
    tables = [t.name for t in schema.metadata.sorted_tables]
    sequences = [f"{t}_id_seq" for t in schema.LOGGED]
    missing = conn.execute(sa.text(query), {"tables": tables, "sequences": sequences}).scalars().all()
    if missing:
        raise StateError(
            f"ledger {w.shown()} cannot be written (this role may not write {', '.join(missing)}): "
            f"{store.GRANT}, or point {w.source} at a writable ledger"
        )


def clean(values: dict[str, Any]) -> dict[str, Any]:
    """Values both engines store alike: NaN is NULL (SQLite's reading), and a NUL character, which
    PostgreSQL's text refuses, is U+FFFD."""
    return {
        k: (
            None
            if isinstance(v, float) and math.isnan(v)
            else v.replace("\x00", "\ufffd")
            if isinstance(v, str)
            else v
        )
        for k, v in values.items()
    }


def _dialect(conn: sa.Connection) -> Any:
    """The connection's dialect module, for its INSERT ... ON CONFLICT (imported when first used:
    PostgreSQL's costs every command that records a quarter of its import time)."""
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects import sqlite

        return sqlite
    from sqlalchemy.dialects import postgresql

    return postgresql


def _upsert(
    conn: sa.Connection, table: sa.Table, values: dict[str, Any], keys: list[str], newer_only: bool = False
) -> None:
    """Insert a row, or update the one with the same `keys` (only if older, when `newer_only`)."""
    stmt = _dialect(conn).insert(table).values(clean(values))
    changed = {c: stmt.excluded[c] for c in values if c not in keys}
    where_clause = table.c.time < stmt.excluded.time if newer_only else None
    conn.execute(stmt.on_conflict_do_update(index_elements=keys, set_=changed, where=where_clause))


def _select(
    table: str,
    query: str | Callable[[frozenset[str]], str],
    args: dict[str, Any] | None = None,
    db: Path | None = None,
) -> list[Row]:
    """The rows of a read-only query on `table`: none while the ledger does not exist, or is of
    an older schema that has no such table yet (a ledger from before bench holds no results).
    `query` (SQL with :name parameters) may be made from the columns the table has in this ledger
    (its schema's version). A row with a value its column cannot hold is left out, and noted
    (take_unreadable)."""
    with store.reading(_at(db)) as conn:
        if conn is None or not store.has_table(conn, table):
            return []
        if callable(query):
            query = query(store.columns_of(conn, table))
        rows = [dict(r._mapping) for r in conn.execute(sa.text(query), args or {})]
    readable = []
    for row in rows:
        problem = _unreadable_because(table, row)
        if problem is None:
            readable.append(row)
        else:
            _unreadable.append(
                f"ledger {_where_shown(db)}: {table} row {_row_name(table, row)}: "
                f"{problem}; the row is skipped (correct or delete it)"
            )
    return readable


def _where_shown(db: Path | None = None) -> str:
    return short_path(db) if db is not None else where().shown()


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


def _unreadable_because(table: str, row: Row) -> str | None:
    """Why `row` cannot be used as its table's schema says (its first bad column), or None."""
    types = column_types().get(table, {})
    for column, value in row.items():
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
        if not value.isascii() and _SURROGATES.search(value):
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


#: The lone surrogates that bytes which are not UTF-8 (a hand edit) become when read.
_SURROGATES = re.compile("[\udc80-\udcff]")


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _shown(value: Any, limit: int = 40) -> str:
    """repr() of a value for a note, cut short."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def _row_name(table: str, row: Row) -> str:
    """`id 7`, or the key of a table without an id (last_good: host and unit)."""
    keys = row.keys()
    if "id" in keys:
        return f"id {row['id']}"
    named = [f"{k}={_shown(row[k])}" for k in ("host", "unit_name", "profile") if k in keys]
    if table == "last_good":
        named = named[:2]
    return " ".join(named)


@functools.cache
def column_types() -> dict[str, dict[str, tuple[str, bool]]]:
    """Per table, each column's type (TEXT, INTEGER, REAL) and whether it is NOT NULL."""

    def kind(column: sa.Column[Any]) -> str:
        if isinstance(column.type, sa.Integer):
            return "INTEGER"
        return "REAL" if isinstance(column.type, sa.Float) else "TEXT"

    return {
        table.name: {c.name: (kind(c), not c.nullable) for c in table.columns}
        for table in schema.metadata.sorted_tables
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
    here = origin()
    with store.writing() as conn:
        conn.execute(
            schema.deploys.insert().values(
                clean(
                    dict(
                        run_id=row.run_id,
                        time=now,
                        host=row.host,
                        unit_name=row.unit_name,
                        profile=row.profile,
                        digest=row.digest,
                        action=row.action,
                        result=row.result,
                        restarted=int(row.restarted),
                        duration_s=row.duration_s,
                        diagnosis=row.diagnosis,
                        model=row.model,
                        phases=json.dumps(row.phases),
                        model_digest=row.model_digest,
                        memory=json.dumps(row.memory),
                        origin=here,
                    )
                )
            )
        )
        if good_unit is not None:
            values = {
                "host": row.host,
                "unit_name": row.unit_name,
                "profile": row.profile,
                "digest": row.digest,
                "unit": good_unit,
                "time": now,
                "facts": json.dumps(facts or {}),
                "origin": here,
            }
            _upsert(conn, schema.last_good, values, ["host", "unit_name"])
            _upsert(conn, schema.good_units, values, ["host", "unit_name", "profile"])


def _good(row: Row | None) -> dict[str, Any] | None:
    """A good-unit row as a record: profile, digest, unit, time and its facts (a dict)."""
    if row is None:
        return None
    record = dict(row)
    record["facts"] = json.loads(record.get("facts") or "{}")
    return record


def good_unit(host: str, unit_name: str, profile: str | None = None) -> dict[str, Any] | None:
    """The last healthy unit of `host` (of `profile`, when given)."""
    if profile is None:
        query = "SELECT * FROM last_good WHERE host=:host AND unit_name=:unit"
        return _good(next(iter(_select("last_good", query, {"host": host, "unit": unit_name})), None))
    query = "SELECT * FROM good_units WHERE host=:host AND unit_name=:unit AND profile=:profile"
    args = {"host": host, "unit": unit_name, "profile": profile}
    return _good(next(iter(_select("good_units", query, args)), None))


def previous_good(host: str, unit_name: str, current_digest: str) -> dict[str, Any] | None:
    """The most recent healthy unit of `host` other than the one it runs now (a row that cannot be
    read is passed over for the one before it)."""
    query = (
        "SELECT * FROM good_units WHERE host=:host AND unit_name=:unit AND digest<>:digest ORDER BY time DESC"
    )
    args = {"host": host, "unit": unit_name, "digest": current_digest}
    return _good(next(iter(_select("good_units", query, args)), None))


def starts(host: str, model: str, limit: int = 5) -> list[list[dict[str, Any]]]:
    """The phases ([{phase, s}]) of the last `limit` healthy starts of `model` on `host`, newest first
    (a phase a hand edit broke is left out, with a note: deploy_phases)."""
    query = (
        "SELECT id, phases FROM deploys WHERE host=:host AND model=:model AND result='healthy' "
        "AND phases<>'[]' ORDER BY time DESC, id DESC LIMIT :limit"
    )
    # A ledger of before start-up phases (read, not migrated, here) has none.
    rows = _select(
        "deploys",
        lambda have: query if "phases" in have else "SELECT 0 AS id, '[]' AS phases WHERE 1=0",
        {"host": host, "model": model, "limit": limit},
    )
    return [found for found in (deploy_phases(dict(r)) for r in rows) if found]


def measured_memory(host: str, model: str, limit: int = 20) -> list[dict[str, Any]]:
    """The GPU memory of the last healthy starts of `model` on `host`, newest first: each start's
    {predicted, measured} (HostReport.memory) where the server logged its figures, with the
    `model_digest` of the files it read. A value a hand edit broke is passed over."""
    query = (
        "SELECT memory, model_digest FROM deploys WHERE host=:host AND model=:model AND result='healthy' "
        "AND memory<>'{}' ORDER BY time DESC, id DESC LIMIT :limit"
    )
    rows = _select(
        "deploys",
        lambda have: query if "memory" in have else "SELECT '{}' AS memory, '' AS model_digest WHERE 1=0",
        {"host": host, "model": model, "limit": limit},
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
        "SELECT model_digest FROM deploys WHERE host=:host AND digest=:digest AND result='healthy' "
        "AND model_digest<>'' ORDER BY time DESC, id DESC LIMIT 1"
    )
    rows = _select(
        "deploys",
        lambda have: query if "model_digest" in have else "SELECT '' AS model_digest WHERE 1=0",
        {"host": host, "digest": unit_digest},
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
        f"ledger {_where_shown()}: deploys row {_row_name('deploys', row)}: {problem}; "
        f"the {what} is skipped (correct or delete it)"
    )


def history(host: str | None = None, limit: int = 50) -> list[Row]:
    """The newest `limit` deploys (of `host`, when given), newest first."""
    if host:
        query = "SELECT * FROM deploys WHERE host=:host ORDER BY time DESC, id DESC LIMIT :limit"
        return _select("deploys", query, {"host": host, "limit": limit})
    return _select(
        "deploys", "SELECT * FROM deploys ORDER BY time DESC, id DESC LIMIT :limit", {"limit": limit}
    )


#: bench_results columns a caller fills: all but the ledger's own (the id, the machine that wrote
#: the row, and where a push copied it from).
BENCH_COLUMNS = [
    c.name for c in schema.bench_results.columns if c.name not in ("id", "origin", "pushed_from")
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
    """Append `row` (time: now unless given) to `table`, as this machine's; its id (0 if none)."""
    t = schema.metadata.tables[table]
    values = clean({"time": time.time(), "origin": origin(), **row})
    with store.writing(_at(db)) as conn:
        if "id" in t.c and t.c.id.autoincrement is True:
            return int(conn.execute(t.insert().values(values).returning(t.c.id)).scalar_one())
        conn.execute(t.insert().values(values))
        return 0


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
    host: str | None = None,
    sweep_id: str | None = None,
) -> list[Row]:
    """Bench rows oldest first, each filter (when given) narrowing them: one profile, from a time
    (epoch seconds) on, one endpoint, one dataset (its name, its digest, or six or more leading
    characters of the digest), concurrency, request rate, temperature, seed, host, sweep or campaign id.

    A ledger of an older schema, read as it is, shows its rows with the newer columns' defaults
    (endpoint generate, ...), so every reader and filter sees one set of columns.
    """
    where: list[str] = []
    args: dict[str, Any] = {}

    def add(clause: str, **values: Any) -> None:
        where.append(clause)
        args.update(values)

    for column, value in (
        ("profile", profile or None),
        ("endpoint", endpoint),
        ("concurrency", concurrency),
        ("host", host),
        ("sweep_id", sweep_id),
    ):
        if value is not None:
            add(f"{column}=:{column}", **{column: value})
    if since is not None:
        add("time>=:since", since=since)
    if dataset is not None:
        clause = "dataset=:dataset OR dataset_digest=:dataset"
        if len(dataset) >= 6:  # six or more leading characters of the digest
            clause += " OR substr(dataset_digest, 1, :dataset_n)=:dataset"
        add(f"({clause})", dataset=dataset, dataset_n=len(dataset))
    for column, number in (("request_rate", request_rate), ("temperature", temperature)):
        if number is not None:  # REAL columns: as the same float the bench parsed, give or take rounding
            near = f"abs({column}-:{column})"
            bound = f"CASE WHEN abs(:{column}) > 1.0 THEN abs(:{column}) ELSE 1.0 END"
            add(f"{near}<=1e-9*{bound}", **{column: float(number)})
    if seed is not None:
        add("seed=:seed", seed=seed)

    def query(have: frozenset[str]) -> str:
        condition = " AND ".join(where) or "1=1"
        return f"SELECT * FROM ({_bench_select(have)}) AS b WHERE {condition} ORDER BY time, id"

    return _select("bench_results", query, args, db)


def _bench_select(have: frozenset[str]) -> str:
    """bench_results with the columns a ledger of an older schema lacks, as their defaults."""
    added = "".join(
        f', {_default_sql(c)} AS "{c.name}"' for c in schema.bench_results.columns if c.name not in have
    )
    return f"SELECT *{added} FROM bench_results"


def _default_sql(column: sa.Column[Any]) -> str:
    default = column.server_default
    if isinstance(default, sa.DefaultClause) and isinstance(default.arg, sa.TextClause):
        return default.arg.text
    return "NULL"


def to_csv(rows: Sequence[Row]) -> str:
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


#: How often a running campaign says it is alive; after STALE_S of silence another may take it over.
HEARTBEAT_S = 20.0
STALE_S = 90.0


def holder() -> str:
    """This process, as a campaign's holder names it: USER@MACHINE pid N."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{origin()} pid {os.getpid()}"


#: The campaigns this process holds (recorded or claimed, not yet let go).
_held: set[str] = set()


def record_campaign(row: dict[str, Any]) -> None:
    """A new campaign (campaigns columns but outcome), held by this process."""
    _insert("campaigns", {"holder": holder(), "heartbeat": time.time(), **row})
    _held.add(str(row["id"]))


def _now(conn: sa.Connection) -> float:
    """The ledger's clock: the database server's, on PostgreSQL, so that two control machines whose
    clocks differ judge a campaign's heartbeat alike."""
    if conn.dialect.name == "postgresql":
        return float(
            conn.execute(sa.text("SELECT extract(epoch FROM clock_timestamp())::float8")).scalar_one()
        )
    return time.time()


def claim_campaign(campaign_id: str) -> None:
    """Hold the campaign for this process, or refuse, naming the one that holds it.

    A holder heard from in the last STALE_S keeps it: two resumes of one campaign at once, from
    one machine or two, never both run. One update decides, so the ledger's own locking settles
    a race; the ledger's clock judges the heartbeat.
    """
    me = holder()
    c = schema.campaigns.c
    with store.writing() as conn:
        now = _now(conn)
        free = sa.or_(c.holder == "", c.holder == me, c.heartbeat.is_(None), c.heartbeat < now - STALE_S)
        claim = schema.campaigns.update().where(c.id == campaign_id, free).values(holder=me, heartbeat=now)
        if conn.execute(claim).rowcount:
            _held.add(campaign_id)
            return
        found = conn.execute(sa.select(c.holder, c.heartbeat).where(c.id == campaign_id)).first()
    if found is None:
        return  # no such campaign: the caller says so
    ago = max(0.0, now - (found.heartbeat or now))
    raise StateError(
        f"campaign {campaign_id} is being run by {found.holder} (heard from {ago:.0f} s ago): let it "
        f"finish or stop it there (Ctrl-C); a holder silent for {STALE_S:.0f} s may be taken over"
    )


@contextmanager
def holding(campaign_id: str, on_lost: Callable[[str], None] | None = None) -> Iterator[None]:
    """While inside: say every HEARTBEAT_S that this process still runs the campaign (once it holds
    it); at the end, let it go. `on_lost(why)` is called once if another process took the
    campaign over, or the ledger stayed unreachable for half of STALE_S."""
    stop = threading.Event()
    me = holder()
    c = schema.campaigns.c

    def beat() -> None:
        failing_since: float | None = None
        while not stop.wait(HEARTBEAT_S):
            try:
                with store.writing() as conn:
                    mine = schema.campaigns.update().where(c.id == campaign_id, c.holder == me)
                    kept = conn.execute(mine.values(heartbeat=_now(conn))).rowcount
                    now_held = conn.execute(sa.select(c.holder).where(c.id == campaign_id)).scalar()
            except Exception as exc:  # the ledger went away: the holder gives up before it is stale
                failing_since = failing_since or time.monotonic()
                if campaign_id in _held and time.monotonic() - failing_since > STALE_S / 2:
                    _lost(f"the ledger could not be reached for {STALE_S / 2:.0f} s ({exc})")
                    return
                continue
            failing_since = None
            if not kept and campaign_id in _held:  # it was ours, and is not: another took it over
                _held.discard(campaign_id)
                _lost(f"{now_held or 'another process'} took the campaign over")
                return

    def _lost(why: str) -> None:
        if on_lost is not None:
            on_lost(why)

    def release() -> None:
        stop.set()
        thread.join()
        _held.discard(campaign_id)
        with store.writing() as conn:
            mine = schema.campaigns.update().where(c.id == campaign_id, c.holder == me)
            conn.execute(mine.values(holder="", heartbeat=None))

    thread = threading.Thread(target=beat, name=f"campaign {campaign_id} heartbeat", daemon=True)
    thread.start()
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # the first failure is the one to show
            release()
        raise
    release()


def update_campaign(campaign_id: str, **changes: Any) -> None:
    """Set a campaign's status, hosts or outcome; only while this process holds it, or nobody does
    (a process another one took the campaign over from changes nothing)."""
    c = schema.campaigns.c
    mine = sa.or_(c.holder == holder(), c.holder == "")
    with store.writing() as conn:
        conn.execute(schema.campaigns.update().where(c.id == campaign_id, mine).values(clean(changes)))


def campaign(campaign_id: str) -> Row | None:
    rows = _select("campaigns", "SELECT * FROM campaigns WHERE id=:id", {"id": campaign_id})
    return rows[0] if rows else None


def record_trial(row: dict[str, Any]) -> None:
    """One finished trial of a campaign (trials columns but id)."""
    _insert("trials", row)


def trials(campaign_id: str) -> list[Row]:
    """A campaign's finished trials, oldest first."""
    query = "SELECT * FROM trials WHERE campaign_id=:id ORDER BY id"
    return _select("trials", query, {"id": campaign_id})


def note_skipped(table: str, row: Row, problem: str) -> None:
    """Skip a row whose values pass their column's type but not what a reader needs of them (a
    campaign's hosts, a trial's point), with the same note as a row of a bad type."""
    _unreadable.append(
        f"ledger {_where_shown()}: {table} row {_row_name(table, row)}: {problem}; "
        "the row is skipped (correct or delete it)"
    )


def update_bench(row_id: int, **changes: Any) -> None:
    """Set columns of one bench row: a tune trial reads the server log once, after its runs are
    in, and fills their accept lengths and notes then."""
    unknown = set(changes) - set(BENCH_COLUMNS)
    if unknown:
        raise ValueError(f"not bench_results columns: {sorted(unknown)}")
    with store.writing() as conn:
        conn.execute(
            schema.bench_results.update().where(schema.bench_results.c.id == row_id).values(clean(changes))
        )


def record_adoption(row: dict[str, Any]) -> int:
    """A hand-started server `adopt` wrote a profile for (adoptions columns but id); its id."""
    return _insert("adoptions", row)


def pending_adoption(host: str, unit_name: str) -> Row | None:
    """The newest adoption of `unit_name` on `host` that no deploy has taken over yet."""
    rows = _select(
        "adoptions",
        "SELECT * FROM adoptions WHERE host=:host AND unit_name=:unit ORDER BY id DESC LIMIT 1",
        {"host": host, "unit": unit_name},
    )
    return rows[0] if rows and rows[0]["state"] == "pending" else None


def update_adoption(adoption_id: int, state: str) -> None:
    """What became of an adoption: taken (the unit runs), relaunched (the unit failed and the hand
    command runs again), gone (the process had ended before the deploy)."""
    with store.writing() as conn:
        conn.execute(
            schema.adoptions.update().where(schema.adoptions.c.id == adoption_id).values(state=state)
        )
