"""The ledger on both of its engines: a SQLite file in the state directory, and a team's PostgreSQL.

Each test that takes `engine` runs twice, once per engine, through the ledger's public functions:
what one engine keeps, the other keeps too (every value, at full precision), both refuse a newer
schema, both settle two writers and two claims of one campaign. The rest is one engine's own:
PostgreSQL that cannot be reached or written; SQLite files of every older release, migrated in place.

PostgreSQL comes from tests/pg.py (the `postgres` and `pg_url` fixtures): a test fails, not skips,
where it is missing.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from pg import Postgres
from sqlalchemy.pool import NullPool

import orchestrator
from orchestrator import ledger
from orchestrator.errors import StateError
from orchestrator.ledger import schema, store

LEDGERS = Path(__file__).parents[1] / "data" / "ledgers"
#: The code under test, for the subprocesses (the same as this process imports).
CODE = Path(orchestrator.__file__).parents[1]

#: Values a PostgreSQL REAL (single precision) or INTEGER (32 bits) would change.
T = 1796504000.8141925
TOK_S = 82.34567891234
TICKS = 2**40


def _legacy() -> types.ModuleType:
    """tests/data/ledgers/legacy_migrations.py: ledgers as the last release before Alembic made them."""
    spec = importlib.util.spec_from_file_location("legacy_migrations", LEDGERS / "legacy_migrations.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


legacy = _legacy()


@dataclass
class Ledger:
    """The ledger a test uses: which engine, how a subprocess reaches it, and raw SQL on it."""

    kind: str
    url: str  # SQLAlchemy's URL of the same database, for raw SQL
    env: dict[str, str]  # a subprocess's environment pointing at it

    def sql(self, statement: str, **params: Any) -> list[sa.Row[Any]]:
        engine = sa.create_engine(self.url, poolclass=NullPool)
        try:
            with engine.begin() as conn:
                result = conn.execute(sa.text(statement), params)
                return list(result.all()) if result.returns_rows else []
        finally:
            engine.dispose()


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ORCHESTRATOR_LEDGER", "ORCHESTRATOR_STATE_DIR")}
    env["PYTHONPATH"] = os.pathsep.join([str(CODE), *filter(None, [env.get("PYTHONPATH")])])
    return {**env, **more}


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Ledger]:
    """The ledger on one engine, fresh and empty: STATE/ledger.sqlite, or a new PostgreSQL database."""
    state = tmp_path / "state"
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(state))
    monkeypatch.delenv("ORCHESTRATOR_LEDGER", raising=False)
    if request.param == "sqlite":
        ledger.use(None)
        found = Ledger(
            "sqlite", f"sqlite:///{state / 'ledger.sqlite'}", _env(ORCHESTRATOR_STATE_DIR=str(state))
        )
    else:
        url = request.getfixturevalue("pg_url")
        ledger.use(url)
        found = Ledger("postgresql", url, _env(ORCHESTRATOR_LEDGER=url))
    try:
        yield found
    finally:
        ledger.use(None)


class Clock:
    """The ledger's `time` module: time() is `now`; the rest is the real module's."""

    def __init__(self) -> None:
        self.now = T

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The time the ledger reads (time.time() in orchestrator/ledger): set clock.now."""
    found = Clock()
    monkeypatch.setattr(ledger, "time", found)
    return found


@pytest.fixture
def sqlite_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The default ledger, STATE/ledger.sqlite, with the state directory made."""
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(state))
    monkeypatch.delenv("ORCHESTRATOR_LEDGER", raising=False)
    ledger.use(None)
    yield state
    ledger.use(None)


def deploy(
    host: str = "lab1",
    profile: str = "cg_5tok",
    digest: str = "d1",
    result: str = "healthy",
    **more: Any,
) -> ledger.DeployRow:
    return ledger.DeployRow(
        "r1", host, "sglang.service", profile, digest, "deploy", result, True, 441.2, **more
    )


def bench(profile: str = "baseline", **more: Any) -> dict[str, Any]:
    return {"run_id": "b1", "host": "lab1", "profile": profile, "result": "ok", **more}


# --- every public function, on both engines --------------------------------------------------------


PHASES = [{"phase": "weights", "s": 250.3}, {"phase": "graphs", "s": 61.8125}]
MEMORY = {"predicted": {"kv_tokens": 590000}, "measured": {"kv_tokens": 587687, "graph_mib": 3054}}


def test_deploys_and_good_units_round_trip(engine: Ledger, clock: Clock) -> None:
    facts = {"port": 30000, "gpus": [0, 1], "speculative": True}
    ledger.record_deploy(
        deploy(model="/m", phases=PHASES, model_digest="model:3f2a", memory=MEMORY, diagnosis="ok"),
        good_unit="[Unit]\nA\n",
        facts=facts,
    )
    clock.now = T + 60
    ledger.record_deploy(deploy(profile="cg_16tok", digest="d2", model="/m"), good_unit="[Unit]\nB\n")
    clock.now = T + 120
    ledger.record_deploy(deploy(profile="cg_bad", digest="d3", result="failed", model="/m"))
    clock.now = T + 180
    ledger.record_deploy(deploy(host="lab2", model="/m", phases=PHASES), good_unit="[Unit]\nC\n")

    rows = ledger.history()
    assert [(r["host"], r["profile"], r["time"]) for r in rows] == [
        ("lab2", "cg_5tok", T + 180),
        ("lab1", "cg_bad", T + 120),
        ("lab1", "cg_16tok", T + 60),
        ("lab1", "cg_5tok", T),
    ]
    assert len({r["id"] for r in rows}) == 4
    first = rows[-1]
    assert first == {
        "id": first["id"],
        "run_id": "r1",
        "time": T,  # to the last bit: a PostgreSQL REAL would keep 7 digits
        "host": "lab1",
        "unit_name": "sglang.service",
        "profile": "cg_5tok",
        "digest": "d1",
        "action": "deploy",
        "result": "healthy",
        "restarted": 1,
        "duration_s": 441.2,
        "diagnosis": "ok",
        "model": "/m",
        "phases": json.dumps(PHASES),
        "model_digest": "model:3f2a",
        "memory": json.dumps(MEMORY),
        "origin": ledger.origin(),
        "pushed_from": None,
    }
    assert [r["profile"] for r in ledger.history("lab1", limit=2)] == ["cg_bad", "cg_16tok"]
    assert ledger.history("lab3") == []

    last = ledger.good_unit("lab1", "sglang.service")
    assert last is not None and (last["profile"], last["unit"], last["facts"]) == (
        "cg_16tok",
        "[Unit]\nB\n",
        {},
    )
    assert last["time"] == T + 60 and last["origin"] == ledger.origin()
    first_good = ledger.good_unit("lab1", "sglang.service", "cg_5tok")
    assert first_good is not None and (first_good["digest"], first_good["facts"]) == ("d1", facts)
    assert ledger.good_unit("lab1", "sglang.service", "cg_bad") is None  # a failed deploy is no good unit
    assert ledger.good_unit("lab1", "other.service") is None
    # The newest good unit other than the one running: across profiles.
    before = ledger.previous_good("lab1", "sglang.service", "d2")
    assert before is not None and (before["profile"], before["unit"]) == ("cg_5tok", "[Unit]\nA\n")
    newest = ledger.previous_good("lab1", "sglang.service", "d1")
    assert newest is not None and newest["profile"] == "cg_16tok"
    assert ledger.previous_good("lab2", "sglang.service", "d1") is None

    # A second healthy deploy of one profile replaces its good unit, and the host's last.
    clock.now = T + 240
    ledger.record_deploy(deploy(digest="d4"), good_unit="[Unit]\nA2\n", facts={"port": 1})
    again = ledger.good_unit("lab1", "sglang.service", "cg_5tok")
    assert again is not None and (again["digest"], again["unit"], again["facts"]) == (
        "d4",
        "[Unit]\nA2\n",
        {"port": 1},
    )
    assert (ledger.good_unit("lab1", "sglang.service") or {})["digest"] == "d4"


def test_starts_memory_and_model_files_round_trip(engine: Ledger, clock: Clock) -> None:
    ledger.record_deploy(deploy(model="/m", phases=PHASES, memory=MEMORY, model_digest="files:1"))
    clock.now = T + 1
    later = [{"phase": "weights", "s": 1e-3}]
    ledger.record_deploy(deploy(digest="d2", model="/m", phases=later, memory={}, model_digest="files:2"))
    clock.now = T + 2
    ledger.record_deploy(deploy(digest="d3", model="/m", phases=PHASES, result="failed", memory=MEMORY))
    ledger.record_deploy(deploy(host="lab2", model="/m", phases=PHASES, memory=MEMORY))

    assert ledger.starts("lab1", "/m") == [later, PHASES]
    assert ledger.starts("lab1", "/m", limit=1) == [later]
    assert ledger.starts("lab1", "/other") == []
    assert ledger.measured_memory("lab1", "/m") == [{**MEMORY, "model_digest": "files:1"}]
    assert ledger.model_digest_of("lab1", "d1") == "files:1"
    assert ledger.model_digest_of("lab1", "d2") == "files:2"
    assert ledger.model_digest_of("lab1", "d3") == ""  # failed: not known to have read anything
    # A bench row of a unit takes the files its start read.
    row_id = ledger.record_bench(bench(digest="d2", time=T))
    assert [(r["id"], r["model_digest"]) for r in ledger.bench_results()] == [(row_id, "files:2")]


def test_bench_rows_round_trip_and_each_filter_narrows_them(engine: Ledger) -> None:
    digest = "a1b2c3d4e5f60718"
    rows = {
        "base": bench(time=T, tok_s=TOK_S, concurrency=1, itl_p99_s=0.0173312345678901),
        "chat": bench(time=T + 10, endpoint="chat", concurrency=4, temperature=0.7, seed=7),
        "data": bench("cg_5tok", time=T + 20, dataset="sharegpt", dataset_digest=digest, concurrency=4),
        "open": bench("cg_5tok", time=T + 30, request_rate=0.1 + 0.2, concurrency=16, seed=1),
        "fail": bench("oom", time=T + 40, result="failed", diagnosis="CUDA out of memory"),
    }
    ids = {name: ledger.record_bench(row) for name, row in rows.items()}
    assert sorted(ids.values()) == list(ids.values()) and len(set(ids.values())) == 5

    def found(**filters: Any) -> list[str]:
        by_id = {v: k for k, v in ids.items()}
        return [by_id[r["id"]] for r in ledger.bench_results(**filters)]

    everything = ledger.bench_results()
    assert [r["id"] for r in everything] == list(ids.values())  # oldest first
    base = everything[0]
    assert (base["time"], base["tok_s"], base["itl_p99_s"]) == (T, TOK_S, 0.0173312345678901)
    assert set(ledger.BENCH_COLUMNS) <= set(base) and base["origin"] == ledger.origin()
    # The columns' defaults, as the schema gives them.
    assert (base["endpoint"], base["dataset"], base["temperature"], base["seed"], base["request_rate"]) == (
        "generate",
        "",
        0.0,
        None,
        None,
    )
    assert (base["git_commit"], base["speculative"], base["repeat"], base["accept_len"]) == (
        "unknown",
        0,
        0,
        None,
    )
    assert everything[3]["request_rate"] == 0.1 + 0.2

    assert found(profile="cg_5tok") == ["data", "open"]
    assert found(since=T + 20) == ["data", "open", "fail"]
    assert found(since=T + 20.000001) == ["open", "fail"]
    assert found(endpoint="chat") == ["chat"]
    assert found(endpoint="generate") == ["base", "data", "open", "fail"]
    assert found(dataset="sharegpt") == ["data"]
    assert found(dataset=digest) == ["data"]
    assert found(dataset=digest[:6]) == ["data"]  # six leading characters of the digest
    assert found(dataset=digest[:5]) == []  # fewer are not a digest
    assert found(dataset=digest[1:8]) == []  # leading ones only
    assert found(dataset="") == ["base", "chat", "open", "fail"]  # the built-in prompts
    assert found(concurrency=4) == ["chat", "data"]
    assert found(request_rate=0.3) == ["open"]  # 0.1 + 0.2 as stored, give or take rounding
    assert found(request_rate=0.31) == []
    assert found(temperature=0.7) == ["chat"]
    assert found(temperature=0) == ["base", "data", "open", "fail"]
    assert found(seed=7) == ["chat"]
    assert found(seed=1, concurrency=16, profile="cg_5tok") == ["open"]
    assert found(seed=1, concurrency=4) == []

    ledger.update_bench(ids["base"], accept_len=3.4133333333333336, notes="read from the log")
    updated = ledger.bench_results(since=T, concurrency=1)
    assert [(r["accept_len"], r["notes"]) for r in updated] == [(3.4133333333333336, "read from the log")]
    assert {k: v for k, v in updated[0].items() if k not in ("accept_len", "notes")} == {
        k: v for k, v in base.items() if k not in ("accept_len", "notes")
    }
    with pytest.raises(ValueError, match="tok_per_s"):
        ledger.update_bench(ids["base"], tok_per_s=1.0)


def test_bench_rows_filter_by_host_and_sweep(engine: Ledger) -> None:
    ledger.record_bench(bench(time=T, sweep_id="s1"))
    ledger.record_bench(bench(time=T + 1, host="lab2", sweep_id="s1"))
    ledger.record_bench(bench(time=T + 2, host="lab2"))
    assert [r["time"] for r in ledger.bench_results(host="lab2")] == [T + 1, T + 2]
    assert [r["host"] for r in ledger.bench_results(sweep_id="s1")] == ["lab1", "lab2"]
    assert [r["time"] for r in ledger.bench_results(host="lab2", sweep_id="s1")] == [T + 1]


def campaign_row(campaign_id: str = "tune-1") -> dict[str, Any]:
    return {
        "id": campaign_id,
        "time": T,
        "space_path": "/spaces/eagle3.yml",
        "space_digest": "ba9c71f5",
        "space": "base: cg_5tok\n",
        "hosts": '["lab1", "lab2"]',
        "status": "running",
    }


def test_campaigns_and_trials_round_trip(engine: Ledger) -> None:
    ledger.record_campaign(campaign_row())
    found = ledger.campaign("tune-1")
    assert found is not None
    assert {k: found[k] for k in campaign_row()} == campaign_row()
    assert (found["outcome"], found["holder"], found["origin"]) == ("{}", ledger.holder(), ledger.origin())
    assert isinstance(found["heartbeat"], float) and abs(found["heartbeat"] - time.time()) < 60
    assert ledger.campaign("tune-2") is None

    outcome = json.dumps({"verdict": "better", "winner": "cg_5tok.3c9e1f"})
    ledger.update_campaign("tune-1", status="done", outcome=outcome)
    done = ledger.campaign("tune-1")
    assert done is not None and (done["status"], done["outcome"]) == ("done", outcome)

    trial = {"campaign_id": "tune-1", "time": T, "kind": "baseline", "point": "{}", "profile": "cg_5tok"}
    ledger.record_trial({**trial, "number": -1, "host": "lab1", "state": "complete", "value": 1.0})
    ledger.record_trial(
        {**trial, "number": 0, "kind": "trial", "point": '{"steps": 3}', "host": "lab2", "state": "complete"}
        | {"value": 1.0634567891234567, "predicted": 1.0412345678901234, "restarted": 0, "curve_id": "tc1"}
    )
    ledger.record_trial({**trial, "campaign_id": "tune-2", "number": 0, "host": "lab1", "state": "failed"})
    got = ledger.trials("tune-1")
    assert [(t["number"], t["host"], t["value"], t["predicted"]) for t in got] == [
        (-1, "lab1", 1.0, None),
        (0, "lab2", 1.0634567891234567, 1.0412345678901234),
    ]
    assert (got[0]["restarted"], got[1]["restarted"], got[1]["curve_id"], got[0]["diagnosis"]) == (
        1,
        0,
        "tc1",
        "",
    )
    assert got[0]["id"] < got[1]["id"]
    assert [t["state"] for t in ledger.trials("tune-2")] == ["failed"]


def test_adoptions_round_trip(engine: Ledger) -> None:
    command = json.dumps({"argv": ["python3", "-m", "sglang.launch_server"], "user": "ops"})
    row = {"time": T, "host": "lab1", "unit_name": "sglang.service", "profile": "hand", "pid": 41872}
    first = ledger.record_adoption(
        {**row, "start_ticks": TICKS, "port": 30000, "command": command, "state": "pending"}
    )
    pending = ledger.pending_adoption("lab1", "sglang.service")
    assert pending is not None
    assert pending == {
        "id": first,
        **row,
        "start_ticks": TICKS,  # 64 bits: a PostgreSQL INTEGER holds 31
        "port": 30000,
        "command": command,
        "state": "pending",
        "origin": ledger.origin(),
        "pushed_from": None,
    }
    assert ledger.pending_adoption("lab2", "sglang.service") is None
    ledger.update_adoption(first, "taken")
    assert ledger.pending_adoption("lab1", "sglang.service") is None
    second = ledger.record_adoption({**row, "start_ticks": TICKS + 1, "port": 30001, "state": "pending"})
    assert second > first
    newest = ledger.pending_adoption("lab1", "sglang.service")
    assert newest is not None and (newest["id"], newest["start_ticks"], newest["command"]) == (
        second,
        TICKS + 1,
        "{}",
    )


# --- a ledger the tool cannot use --------------------------------------------------------------------


def test_a_newer_schema_is_refused_for_writes_and_reads(engine: Ledger) -> None:
    ledger.record_deploy(deploy())
    engine.sql("UPDATE alembic_version SET version_num='0099'")
    newer = f"has schema version 99, newer than this orchestrator knows ({schema.HEAD})"
    assert schema.HEAD == 11
    for call in (ledger.ready, lambda: ledger.record_deploy(deploy()), ledger.history, ledger.bench_results):
        with pytest.raises(StateError, match=re.escape(newer)) as refused:
            call()
        assert ledger.where().shown() in str(refused.value) and "\n" not in str(refused.value)
    assert engine.sql("SELECT count(*) FROM deploys")[0][0] == 1  # nothing written, nothing migrated
    assert engine.sql("SELECT version_num FROM alembic_version")[0][0] == "0099"


def test_an_unreachable_postgresql_is_one_line_naming_it_and_why() -> None:
    with socket.socket() as held:  # bound, never listening: nothing answers on this port
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        ledger.use(f"postgresql://orch@127.0.0.1:{port}/ledger")
        try:
            for call in (ledger.ready, ledger.history):
                with pytest.raises(StateError) as refused:
                    call()
                text = str(refused.value)
                assert "\n" not in text, text
                assert f"ledger postgresql://orch@127.0.0.1:{port}/ledger cannot be reached (" in text, text
                assert "Connection refused" in text, text  # the driver's reason
                assert "--ledger" in text, text  # what to change
        finally:
            ledger.use(None)


def test_a_role_granted_table_by_table_is_refused_before_a_record_that_would_fail(
    postgres: Postgres, pg_url: str
) -> None:
    """INSERT and UPDATE on the tables but no USAGE on the id sequences: ready() names what is
    missing, so a deploy never restarts a server and then fails to record it."""
    ledger.use(pg_url)
    try:
        ledger.ready()
        name = sa.make_url(pg_url).database
        postgres.psql(
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname='writer') THEN "
            "CREATE ROLE writer LOGIN; END IF; END $$; "
            f"GRANT CONNECT ON DATABASE {name} TO writer; GRANT USAGE ON SCHEMA public TO writer; "
            "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO writer;",
            name,
        )
        ledger.use(str(sa.make_url(pg_url).set(username="writer")))
        with pytest.raises(StateError, match="may not write adoptions_id_seq, bench_results_id_seq") as e:
            ledger.ready()
        assert "USAGE on its sequences" in str(e.value)
        postgres.psql("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO writer;", name)
        ledger.ready()
        ledger.record_deploy(deploy())
    finally:
        ledger.use(None)


def test_a_read_only_role_cannot_write_but_reads(postgres: Postgres, pg_url: str) -> None:
    ledger.use(pg_url)
    try:
        ledger.record_deploy(deploy())
        ledger.record_bench(bench(time=T))
        reader = postgres.readonly_url(pg_url)
        ledger.use(reader)
        for call in (ledger.ready, lambda: ledger.record_bench(bench())):
            with pytest.raises(StateError, match="cannot be written") as refused:
                call()
            text = str(refused.value)
            assert "\n" not in text and "reader@127.0.0.1" in text, text
            assert "permission denied" in text or "may not write" in text, text
        assert [r["host"] for r in ledger.history()] == ["lab1"]
        assert [r["time"] for r in ledger.bench_results()] == [T]
        assert ledger.good_unit("lab1", "sglang.service") is None
    finally:
        ledger.use(None)


def test_a_connection_the_server_dropped_is_not_an_unreachable_ledger(
    postgres: Postgres, pg_url: str
) -> None:
    ledger.use(pg_url)
    try:
        ledger.record_deploy(deploy())
        assert len(ledger.history()) == 1  # both of the ledger's engines (write, read) hold a connection
        name = sa.make_url(pg_url).database
        postgres.psql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname='{name}'")
        # The server is up: it is reached, for a read and a write.
        assert [r["host"] for r in ledger.history()] == ["lab1"]
        ledger.record_deploy(deploy(host="lab2"))
    finally:
        ledger.use(None)


# --- campaigns held by one process at a time ------------------------------------------------------


CLAIM = """
import sys
from orchestrator import ledger
from orchestrator.errors import StateError
try:
    ledger.claim_campaign(sys.argv[1])
except StateError as e:
    print(e)
    sys.exit(3)
print(ledger.holder())
"""


def _claim_elsewhere(engine: Ledger, campaign_id: str) -> subprocess.CompletedProcess[str]:
    """claim_campaign in another process (another holder: its own pid)."""
    return subprocess.run(
        [sys.executable, "-c", CLAIM, campaign_id], env=engine.env, capture_output=True, text=True, timeout=60
    )


def test_a_campaign_is_held_by_one_process_until_it_goes_quiet(
    engine: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger.record_campaign(campaign_row())
    me = ledger.holder()
    # Another process's claim is refused, naming this one.
    other = _claim_elsewhere(engine, "tune-1")
    assert other.returncode == 3, other.stderr
    assert f"campaign tune-1 is being run by {me} (heard from" in other.stdout
    ledger.claim_campaign("tune-1")  # the holder itself may claim it again

    # Another holder, heard from just now: this process is refused, naming it.
    engine.sql("UPDATE campaigns SET holder='ops@lab9 pid 7', heartbeat=:t WHERE id='tune-1'", t=time.time())
    with pytest.raises(StateError, match=r"campaign tune-1 is being run by ops@lab9 pid 7 \(heard from") as e:
        ledger.claim_campaign("tune-1")
    assert "\n" not in str(e.value)
    # A process another one holds the campaign for changes nothing of it.
    ledger.update_campaign("tune-1", status="done")
    assert (ledger.campaign("tune-1") or {})["status"] == "running"
    # Silent for more than STALE_S: taken over.
    engine.sql("UPDATE campaigns SET heartbeat=:t WHERE id='tune-1'", t=time.time() - ledger.STALE_S - 5)
    ledger.claim_campaign("tune-1")
    held = ledger.campaign("tune-1")
    assert held is not None and held["holder"] == me and time.time() - held["heartbeat"] < 60

    # While held, the heartbeat keeps it fresh; at the end it is let go, and another takes it.
    monkeypatch.setattr(ledger, "HEARTBEAT_S", 0.05)
    stale = time.time() - 1000
    with ledger.holding("tune-1"):
        ledger.update_campaign("tune-1", heartbeat=stale)
        deadline = time.monotonic() + 10
        while (ledger.campaign("tune-1") or {})["heartbeat"] == stale and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (ledger.campaign("tune-1") or {})["heartbeat"] > stale
    released = ledger.campaign("tune-1")
    assert released is not None and (released["holder"], released["heartbeat"]) == ("", None)
    taken = _claim_elsewhere(engine, "tune-1")
    assert taken.returncode == 0, taken.stdout + taken.stderr
    assert (ledger.campaign("tune-1") or {})["holder"] == taken.stdout.strip() != me


def test_a_holder_whose_campaign_was_taken_over_is_told_and_changes_nothing(
    engine: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A holder that went quiet (a stalled machine, a lost network) and came back: the one that took
    the campaign over keeps it. The first is told, once; its end writes nothing on the campaign."""
    monkeypatch.setattr(ledger, "HEARTBEAT_S", 0.05)
    ledger.record_campaign(campaign_row())
    told: list[str] = []
    with ledger.holding("tune-1", on_lost=told.append):
        deadline = time.monotonic() + 10
        while (ledger.campaign("tune-1") or {})["heartbeat"] is None and time.monotonic() < deadline:
            time.sleep(0.02)
        engine.sql("UPDATE campaigns SET holder='ops@lab9 pid 7' WHERE id='tune-1'")
        while not told and time.monotonic() < deadline:
            time.sleep(0.02)
        ledger.update_campaign("tune-1", status="interrupted")
    assert told == ["ops@lab9 pid 7 took the campaign over"]
    kept = ledger.campaign("tune-1")
    assert kept is not None and (kept["holder"], kept["status"]) == ("ops@lab9 pid 7", "running")


def test_holding_lets_the_campaign_go_when_the_run_fails(engine: Ledger) -> None:
    ledger.record_campaign(campaign_row())
    with pytest.raises(KeyboardInterrupt), ledger.holding("tune-1"):
        raise KeyboardInterrupt
    released = ledger.campaign("tune-1")
    assert released is not None and (released["holder"], released["heartbeat"]) == ("", None)


# --- two writers at once --------------------------------------------------------------------------


WRITER = """
import sys, time
from pathlib import Path
from orchestrator import ledger
n, gate = sys.argv[1], Path(sys.argv[2])
(gate / f"ready-{n}").touch()
while not (gate / "go").exists():
    time.sleep(0.002)
for i in range(300):
    ledger.record_bench({"run_id": f"w{n}-{i}", "host": f"w{n}", "profile": f"w{n}", "result": "ok"})
    if i % 3 == 2:
        done = ("deploy", "healthy", True, 1.0)
        ledger.record_deploy(ledger.DeployRow(f"w{n}-{i // 3}", f"w{n}", "sglang.service", "p", "d", *done))
"""


def test_two_processes_writing_at_once_lose_nothing(engine: Ledger, tmp_path: Path) -> None:
    """Two writers on a ledger that does not exist yet: they also race to make its schema."""
    gate = tmp_path / "gate"
    gate.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, n, str(gate)],
            env=engine.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in ("1", "2")
    ]
    try:
        deadline = time.monotonic() + 60
        while not all((gate / f"ready-{n}").exists() for n in ("1", "2")):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a writer died"
            time.sleep(0.01)
        (gate / "go").touch()
        done = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], done

    rows = ledger.bench_results()
    assert len(rows) == 600 and len({r["id"] for r in rows}) == 600
    deploys = ledger.history(limit=1000)
    assert len(deploys) == 200 and len({r["id"] for r in deploys}) == 200
    for n in ("1", "2"):
        assert sorted(r["run_id"] for r in rows if r["host"] == f"w{n}") == sorted(
            f"w{n}-{i}" for i in range(300)
        )
        assert sorted(r["run_id"] for r in deploys if r["host"] == f"w{n}") == sorted(
            f"w{n}-{i}" for i in range(100)
        )
        # Each process's rows in the order it wrote them.
        mine = [int(r["run_id"].split("-")[1]) for r in rows if r["host"] == f"w{n}"]
        assert mine == list(range(300))
    # They did write at once: each wrote rows between two of the other's.
    hosts = [r["host"] for r in rows]
    switches = sum(a != b for a, b in itertools.pairwise(hosts))
    assert switches >= 2, "one writer finished before the other started"


# --- the schema ---------------------------------------------------------------------------------


def _tables(engine: Ledger) -> list[str]:
    if engine.kind == "sqlite":
        file = Path(sa.make_url(engine.url).database or "")
        return list(_columns(file)) if file.exists() else []
    found = engine.sql("SELECT tablename FROM pg_tables WHERE schemaname='public'")
    return [r[0] for r in found if r[0] != "alembic_version"]


def test_the_migrations_make_the_schema_that_schema_py_declares(engine: Ledger) -> None:
    # Reads of a new ledger find nothing, and make nothing: no file, no table.
    assert ledger.history() == [] and ledger.bench_results() == [] and ledger.campaign("c") is None
    assert _tables(engine) == []
    ledger.ready()
    assert sorted(_tables(engine)) == sorted(schema.metadata.tables)
    with ledger.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        assert compare_metadata(context, schema.metadata) == []
        assert store.version_of(conn, ledger.where()) == schema.HEAD
    assert engine.sql("SELECT version_num FROM alembic_version")[0][0] == f"{schema.HEAD:04d}"
    [(ledger_id,)] = engine.sql("SELECT value FROM ledger_info WHERE key='ledger_id'")
    assert len(ledger_id) == 32 and int(ledger_id, 16) >= 0
    seen = engine.sql("SELECT value FROM ledger_info WHERE key=:k", k=f"seen:{ledger.origin()}")
    assert len(seen) == 1 and abs(float(seen[0][0]) - time.time()) < 60


# --- SQLite ledgers of older releases, migrated in place -----------------------------------------


def _rows(db: Path, table: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY rowid")]
    finally:
        conn.close()


def test_the_last_releases_ledger_is_migrated_in_place_and_keeps_every_row(sqlite_state: Path) -> None:
    db = sqlite_state / "ledger.sqlite"
    shutil.copy(LEDGERS / "v9.sqlite", db)
    before = json.loads((LEDGERS / "v9.json").read_text())
    assert len(ledger.history()) == len(before["deploys"])  # read as it is, first
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 9

    ledger.ready()

    new = {"origin": "", "pushed_from": None, "holder": "", "heartbeat": None, "fleet": ""}
    for table, rows in before.items():
        after = _rows(db, table)
        assert [{k: r[k] for k in rows[0]} for r in after] == rows, table
        added = set(after[0]) - set(rows[0])
        assert added == set(schema.metadata.tables[table].columns.keys()) - set(rows[0]), table
        assert added and all({k: r[k] for k in added} == {k: new[k] for k in added} for r in after), table
    info = {r["key"]: r["value"] for r in _rows(db, "ledger_info")}
    assert len(info["ledger_id"]) == 32 and f"seen:{ledger.origin()}" in info
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 11
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(f"{schema.HEAD:04d}",)]
    # And the public reads give what the release wrote.
    assert [r["run_id"] for r in ledger.history(limit=100)] == [
        r["run_id"] for r in sorted(before["deploys"], key=lambda r: (-r["time"], -r["id"]))
    ]
    assert [{k: r[k] for k in before["bench_results"][0]} for r in ledger.bench_results()] == sorted(
        before["bench_results"], key=lambda r: (r["time"], r["id"])
    )


@pytest.mark.parametrize("version", range(10))
def test_a_ledger_of_every_older_version_is_read_then_migrated(sqlite_state: Path, version: int) -> None:
    db = legacy.make_ledger(sqlite_state / "ledger.sqlite", version)
    deploy_rows = 1 if version >= 1 else 0  # 0: a file made, nothing in it yet
    with sqlite3.connect(db) as conn:
        if version >= 1:
            conn.execute(
                "INSERT INTO deploys (run_id, time, host, unit_name, profile, digest, action, result,"
                " restarted, duration_s) VALUES ('x', :t, 'lab1', 'sglang.service', 'cg_5tok', 'd1',"
                " 'deploy', 'healthy', 1, 2.5)",
                {"t": T},
            )
        if version >= 2:
            conn.execute(
                "INSERT INTO bench_results (run_id, time, host, profile, result, tok_s, concurrency)"
                " VALUES ('b', :t, 'lab1', 'cg_5tok', 'ok', :tok_s, 2)",
                {"t": T, "tok_s": TOK_S},
            )
    bench_rows = 1 if version >= 2 else 0

    def check() -> None:
        rows = [(r["run_id"], r["time"], r["duration_s"], r["diagnosis"]) for r in ledger.history()]
        assert rows == [("x", T, 2.5, "")] * deploy_rows
        found = ledger.bench_results(endpoint="generate", concurrency=2, temperature=0)
        assert [(r["tok_s"], r["time"], r["dataset"]) for r in found] == [(TOK_S, T, "")] * bench_rows

    check()  # read as it is: not migrated
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == version
    ledger.ready()
    check()
    assert store.expected_columns(schema.HEAD) == {t: frozenset(c) for t, c in _columns(db).items()}
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 11
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(f"{schema.HEAD:04d}",)]
    ledger.record_bench(bench(time=T + 1, tok_s=1.5))
    assert [r["tok_s"] for r in ledger.bench_results()] == [TOK_S] * bench_rows + [1.5]


def _columns(db: Path) -> dict[str, list[str]]:
    conn = sqlite3.connect(db)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {
            t: [c[1] for c in conn.execute(f"PRAGMA table_info({t})")]
            for t in tables
            if t != "alembic_version"
        }
    finally:
        conn.close()


def test_a_nul_in_text_and_a_nan_are_stored_alike_on_both_engines(engine: Ledger) -> None:
    """A server log's NUL byte in a diagnosis, and a NaN metric: PostgreSQL's text refuses NUL and
    keeps NaN, SQLite keeps NUL and reads NaN as NULL. The ledger stores both alike on each."""
    ledger.record_deploy(deploy(result="failed", diagnosis="log: a\x00b"))
    ledger.record_bench(bench(tok_s=float("nan"), notes="x\x00y"))
    assert [r["diagnosis"] for r in ledger.history()] == ["log: a\ufffdb"]
    rows = ledger.bench_results()
    assert [(r["tok_s"], r["notes"]) for r in rows] == [(None, "x\ufffdy")]
    assert ledger.take_unreadable() == []


def test_a_push_copies_each_row_once_and_keeps_its_origin(
    engine: Ledger, tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ledger push`: a laptop's SQLite ledger into the team's. Counts are what was copied; a second
    push copies only what was recorded since; a campaign comes without its holder; a good unit
    replaces the target's only when newer."""
    from orchestrator.ledger import team

    target = ledger.where()
    laptop = tmp_path / "laptop" / "ledger.sqlite"
    ledger.record_deploy(deploy(host="lab2", digest="new"), good_unit="[Unit] team", facts={})
    # The laptop's rows, recorded by an older machine, at an older time.
    monkeypatch.setenv("ORCHESTRATOR_LEDGER", str(laptop))
    ledger.use(None)
    clock.now = T - 100
    ledger.record_deploy(deploy(host="lab1"), good_unit="[Unit] laptop 1", facts={"port": 30000})
    ledger.record_deploy(deploy(host="lab2", digest="old"), good_unit="[Unit] laptop 2", facts={})
    ledger.record_bench(bench(tok_s=82.3))
    ledger.record_campaign(
        {"id": "c1", "space_path": "s.yml", "space_digest": "x", "space": "", "hosts": "[]", "status": "done"}
    )
    ledger.record_trial(
        {
            "campaign_id": "c1",
            "number": 0,
            "kind": "trial",
            "point": "{}",
            "profile": "p",
            "host": "lab1",
            "state": "complete",
        }
    )
    monkeypatch.delenv("ORCHESTRATOR_LEDGER")
    ledger.use(None if engine.kind == "sqlite" else engine.url)

    first = team.push(laptop, target)
    assert first.copied == {
        "adoptions": 0,
        "bench_results": 1,
        "campaigns": 1,
        "deploys": 2,
        "good_units": 1,  # lab1's; lab2's is older than the team's
        "last_good": 1,
        "trials": 1,
    }, first.copied
    assert first.had["good_units"] == 1 and first.had["last_good"] == 1
    again = team.push(laptop, target)
    assert set(again.copied.values()) == {0}, again.copied

    hosts = sorted((r["host"], r["digest"]) for r in ledger.history())
    assert hosts == [("lab1", "d1"), ("lab2", "new"), ("lab2", "old")]
    assert ledger.good_unit("lab2", "sglang.service")["unit"] == "[Unit] team"
    assert ledger.good_unit("lab1", "sglang.service")["facts"] == {"port": 30000}
    laptop_id = (
        sa.create_engine(f"sqlite:///{laptop}")
        .connect()
        .execute(sa.text("SELECT value FROM ledger_info WHERE key='ledger_id'"))
        .scalar_one()
    )
    pushed = [r["pushed_from"] for r in ledger.history() if r["pushed_from"]]
    assert sorted(pushed) == [f"{laptop_id}:1@{T - 100!r}", f"{laptop_id}:2@{T - 100!r}"]
    assert {r["origin"] for r in ledger.history()} == {socket.gethostname()}
    assert ledger.campaign("c1")["holder"] == ""
    assert [t["host"] for t in ledger.trials("c1")] == ["lab1"]

    ledger.use(str(laptop))
    ledger.record_bench(bench(tok_s=90.0))
    ledger.use(None if engine.kind == "sqlite" else engine.url)
    assert team.push(laptop, target).copied["bench_results"] == 1
    assert sorted(r["tok_s"] for r in ledger.bench_results()) == [82.3, 90.0]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://alice:s3cret@127.0.0.1:1/orch",
        "postgresql://alice@127.0.0.1:1/orch?password=s3cret",
        "postgresql://alice@127.0.0.1:1/orch?sslmode=disable&password=s3cret&connect_timeout=2",
    ],
)
def test_a_password_in_the_url_is_never_printed(url: str, tmp_path: Path) -> None:
    """Every line that names the ledger: an error, history's title, `ledger status`."""
    from click.testing import CliRunner

    from orchestrator.cli.main import cli

    for args in (["history"], ["results"], ["ledger", "status", "--json"]):
        done = CliRunner().invoke(
            cli, ["--ledger", url, *args], env={"ORCHESTRATOR_STATE_DIR": str(tmp_path)}
        )
        assert done.exit_code == 2, done.output
        assert "s3cret" not in done.output and "alice" in done.output and "127.0.0.1:1" in done.output
        assert done.output.count("\n") == 1 and "cannot be reached" in done.output, done.output
    assert "s3cret" not in store.parse(url).shown()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://alice:s3cret@127.0.0.1:x40/orch", "is not a ledger URL"),
        ("mysql://alice@127.0.0.1/orch", "give postgresql://USER@HOST:PORT/DB"),
        ("postgresql://alice@127.0.0.1:1", "names no database"),
        ("postgresql://alice@127.0.0.1:1/orch?bogusopt=1", "cannot be used (invalid connection option"),
    ],
)
def test_a_ledger_url_that_cannot_work_is_one_line_naming_it(url: str, says: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from orchestrator.cli.main import cli

    done = CliRunner().invoke(
        cli, ["--ledger", url, "history"], env={"ORCHESTRATOR_STATE_DIR": str(tmp_path)}
    )
    assert done.exit_code == 2 and done.output.count("\n") == 1, done.output
    assert says in done.output and "s3cret" not in done.output and "Traceback" not in done.output, done.output
