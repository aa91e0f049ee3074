"""A ledger row edited by hand (issue 21, class 8): text in a number column, a `time` of 'abc' or
1e308, bytes that are not UTF-8. SQLite keeps what it is given whatever the column's type, so
every read checks each row against the schema; one that does not fit is skipped, and the command
says so in one note naming the table, the row and the column. The same for every reader: history,
results (table, CSV, JSON, plot), a bench's standing against the baseline, a sweep's ranking, and
a rollback's choice of unit.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from orchestrator import ledger
from orchestrator.cli.main import cli
from orchestrator.hosts import playvars
from orchestrator.hosts.host_report import HostReport
from orchestrator.hosts.rollback import _target
from orchestrator.tuning import sweep

FACTS = {"profile": "cg_5tok", "port": 30000, "bind": "0.0.0.0", "gpus": [0], "health_url": "http://x/health"}

#: (column, value as SQL) a hand edit may leave, and what the note says about it.
BAD_DEPLOY_VALUES = [
    ("time", "'abc'", "time holds 'abc', not a number"),
    ("time", "1e308", "time holds 1e+308, out of range"),
    ("time", "-1", "time holds -1.0, not a time"),
    ("duration_s", "'3 s'", "duration_s holds '3 s', not a number"),
    ("restarted", "'yes'", "restarted holds 'yes', not a number"),
    ("restarted", "0.5", "restarted holds 0.5, not a whole number"),
    ("host", "x'00ff'", "host holds b'\\x00\\xff', not text"),
    ("diagnosis", "CAST(x'ff' AS TEXT)", "diagnosis holds '\\udcff', not UTF-8 text"),
    ("profile", "NULL", "profile is empty (NULL)"),
]


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    ledger.take_unreadable()  # none left over from another test
    return tmp_path / "state"


def edit(sql: str) -> None:
    """What a user does with the sqlite3 shell (the schema's NOT NULL aside, which a table rebuilt
    by hand may have lost: rebuilt here the same way)."""
    conn = sqlite3.connect(ledger.path())
    conn.execute("PRAGMA writable_schema=ON")  # lets a NULL into a NOT NULL column, as a rebuilt table would
    conn.execute("UPDATE sqlite_master SET sql=replace(sql, 'NOT NULL', '') WHERE type='table'")
    conn.commit()
    conn.close()
    conn = sqlite3.connect(ledger.path())
    conn.execute(sql)
    conn.commit()
    conn.close()


def deploys(*hosts: str) -> None:
    for host in hosts:
        row = ledger.DeployRow("r", host, "sglang.service", "cg_5tok", "d1", "deploy", "healthy", True, 3.0)
        ledger.record_deploy(row, good_unit="[Unit]\n", facts=FACTS | {"profile": host})


def one_note(done: Result, *, table: str, row: str, what: str) -> None:
    """Exit 0, no traceback, and stderr one note naming the row and the column."""
    assert done.exit_code == 0, done.output
    assert "Traceback" not in done.output and "internal error" not in done.output, done.output
    assert done.stderr.startswith(f"note: ledger {ledger.path()}: {table} row {row}: {what}"), done.stderr
    assert done.stderr.endswith("; the row is skipped (correct or delete it)\n"), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize(("column", "value", "what"), BAD_DEPLOY_VALUES, ids=lambda v: str(v)[:20])
def test_history_skips_a_hand_edited_row_and_names_it(column: str, value: str, what: str) -> None:
    deploys("lab1", "lab2", "lab3")
    edit(f"UPDATE deploys SET {column}={value} WHERE id=2")
    for args in (["history"], ["history", "--json"]):
        done = CliRunner().invoke(cli, args)
        one_note(done, table="deploys", row="id 2", what=what)
    assert [r["host"] for r in json.loads(done.stdout)] == ["lab3", "lab1"]
    assert "lab3" in CliRunner().invoke(cli, ["history"]).stdout


BAD_BENCH_VALUES = [
    ("tok_s", "'fast'", "tok_s holds 'fast', not a number"),
    ("tok_s", "1e308", "tok_s holds 1e+308, out of range"),
    ("time", "'abc'", "time holds 'abc', not a number"),
    ("time", "1e308", "time holds 1e+308, out of range"),
    ("errors", "'none'", "errors holds 'none', not a number"),
    ("accept_len", "x'01'", "accept_len holds b'\\x01', not a number"),
    ("port", "1e308", "port holds 1e+308, not a whole number"),
]


def benches() -> None:
    for profile, tok_s in (("baseline", 80.0), ("cg_5tok", 90.0), ("cg_5tok", 92.0)):
        row = {
            "run_id": "r",
            "host": "lab1",
            "profile": profile,
            "result": "ok",
            "tok_s": tok_s,
            "port": 30000,
        }
        ledger.record_bench(row | {"accept_len": 2.0, "speculative": int(profile != "baseline")})


@pytest.mark.parametrize(("column", "value", "what"), BAD_BENCH_VALUES, ids=lambda v: str(v)[:20])
def test_results_skip_a_hand_edited_row_and_name_it(
    column: str, value: str, what: str, tmp_path: Path
) -> None:
    benches()
    edit(f"UPDATE bench_results SET {column}={value} WHERE id=3")
    png = tmp_path / "tok_s.png"
    plot = [["--plot", str(png)]] if column == "tok_s" else []  # matplotlib takes a while
    for args in ([], ["--format", "csv"], ["--format", "json"], *plot):
        done = CliRunner().invoke(cli, ["results", *args])
        assert done.exit_code == 0 and "Traceback" not in done.output, done.output
        [note] = [line for line in done.stderr.splitlines() if line.startswith("note: ")]
        assert note.startswith(f"note: ledger {ledger.path()}: bench_results row id 3: {what}")
    assert not plot or png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(("column", "value", "what"), BAD_BENCH_VALUES[:2], ids=lambda v: str(v)[:20])
def test_a_benchs_standing_and_a_sweeps_ranking_pass_over_a_hand_edited_row(
    column: str, value: str, what: str
) -> None:
    """bench's "in the ledger for lab1: ...x baseline" line and sweep's ranking read the rows too."""
    benches()
    ledger.record_bench({"run_id": "r", "host": "lab1", "profile": "cg_5tok", "result": "ok", "tok_s": 1.0})
    edit(f"UPDATE bench_results SET {column}={value} WHERE id=4")
    base, best = sweep.standing("lab1")
    assert base is not None and best is not None and (base.mean, best.mean) == (80.0, 91.0)
    [note] = ledger.take_unreadable()
    assert f"bench_results row id 4: {what}" in note


def test_a_rollback_passes_over_a_hand_edited_good_unit_for_the_one_before() -> None:
    deploys("lab1")
    ledger.record_deploy(
        ledger.DeployRow("r", "lab1", "sglang.service", "cg_2step", "d2", "deploy", "healthy", True, 3.0),
        good_unit="[Unit]\n",
        facts=FACTS,
    )
    edit("UPDATE good_units SET time='abc' WHERE profile='cg_2step'")
    good = ledger.previous_good("lab1", "sglang.service", "d9")
    assert good is not None and good["profile"] == "cg_5tok"  # the one before it
    assert ledger.good_unit("lab1", "sglang.service", "cg_2step") is None
    notes = ledger.take_unreadable()
    assert notes and all(
        "good_units row host='lab1' unit_name='sglang.service' profile='cg_2step'" in n for n in notes
    )
    assert "time holds 'abc', not a number" in notes[0]
    edit("UPDATE last_good SET facts='{not json'")
    assert ledger.good_unit("lab1", "sglang.service") is None
    assert (
        "last_good row host='lab1' unit_name='sglang.service': facts holds '{not json', not a JSON object"
        in (ledger.take_unreadable()[0])
    )


def test_a_rollback_refuses_a_good_unit_whose_facts_were_edited_into_another_shape() -> None:
    report = HostReport(host="lab1", ok=False, step="rollback", digest="d9", previous_digest="d9")
    good = {"profile": "cg_5tok", "digest": "d1", "unit": "[Unit]\n", "facts": FACTS | {"port": "abc"}}
    assert _target(report, good, "d9") == (
        "the facts recorded with the last known good (cg_5tok, d1) cannot be read (port: Input should be a "
        "valid integer, unable to parse string as an integer): deploy that profile instead"
    )
    assert _target(report, good | {"facts": FACTS}, "d9") == ""
    playvars.UnitFacts.model_validate(FACTS)
