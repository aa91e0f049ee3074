"""The ledger's bench results: migrated from an older file, two writers at once, CSV, and the plot."""

from __future__ import annotations

import csv
import importlib.util
import io
import multiprocessing
import sqlite3
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

from orchestrator import ledger
from orchestrator.ledger import schema, store
from orchestrator.tuning.plot import plot
from orchestrator.tuning.sweep import ranking


def _legacy() -> ModuleType:
    """tests/data/ledgers/legacy_migrations.py: ledgers as the last release before Alembic made them."""
    path = Path(__file__).parents[1] / "data" / "ledgers" / "legacy_migrations.py"
    spec = importlib.util.spec_from_file_location("legacy_migrations", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


legacy = _legacy()


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def ok_row(profile: str, tok_s: float, accept: float, **more: object) -> dict:
    spec = int(profile != "baseline")
    return {"run_id": "r", "host": "lab2", "profile": profile, "result": "ok", "tok_s": tok_s} | {
        "accept_len": accept,
        "accept_len_log": accept if spec else None,  # the run's own figure, read from its log
        "speculative": spec,
        **more,
    }


def test_a_version_1_ledger_is_migrated_and_keeps_its_deploys(state: Path) -> None:
    db = ledger.path()
    db.parent.mkdir(parents=True)
    legacy.make_ledger(db, 1)
    old = sqlite3.connect(db)
    old.execute(
        "INSERT INTO deploys (run_id, time, host, unit_name, profile, digest, action, result, restarted,"
        " duration_s) VALUES ('x', 1.0, 'lab1', 'sglang.service', 'cg_5tok', 'abc', 'deploy', 'healthy',"
        " 1, 2.0)"
    )
    old.execute("INSERT INTO good_units VALUES ('lab1', 'sglang.service', 'cg_5tok', 'abc', '[Unit]', 1.0)")
    old.commit()
    old.close()
    ledger.record_bench(ok_row("cg_5tok", 82.3, 2.12))
    with ledger.connect() as conn:
        assert store.version_of(conn, ledger.where()) == schema.HEAD == 11
        version_num = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
        assert version_num == f"{schema.HEAD:04d}"
        # An orchestrator of before Alembic reads this and refuses the ledger as newer.
        assert conn.exec_driver_sql("PRAGMA user_version").scalar_one() == 11
    assert [r["profile"] for r in ledger.history()] == ["cg_5tok"]
    assert [r["tok_s"] for r in ledger.bench_results()] == [82.3]
    # Migration 3: a good unit recorded before facts were kept has none (rollback says so).
    old_good = ledger.good_unit("lab1", "sglang.service", "cg_5tok")
    assert old_good is not None and old_good["unit"] == "[Unit]" and old_good["facts"] == {}


def test_a_good_unit_keeps_its_facts() -> None:
    facts = {"profile": "cg_5tok", "port": 30001, "bind": "10.0.0.1", "gpus": [4, 5], "rank": 0}
    row = ledger.DeployRow("r1", "lab1", "sglang.service", "cg_5tok", "d1", "deploy", "healthy", True, 3.0)
    ledger.record_deploy(row, good_unit="[Unit]\n", facts=facts)
    for good in (
        ledger.good_unit("lab1", "sglang.service"),
        ledger.previous_good("lab1", "sglang.service", "x"),
    ):
        assert good is not None and good["facts"] == facts and good["digest"] == "d1"


def test_filters_unknown_columns_and_csv_export() -> None:
    ledger.record_bench(ok_row("baseline", 90.0, 1.0, time=1000.0))
    ledger.record_bench(ok_row("cg_5tok", 82.3, 2.12, time=2000.0, notes='a "quoted", note'))
    assert [r["profile"] for r in ledger.bench_results(since=1500.0)] == ["cg_5tok"]
    assert [r["profile"] for r in ledger.bench_results(profile="baseline")] == ["baseline"]
    with pytest.raises(ValueError, match="tok_per_s"):
        ledger.record_bench({"tok_per_s": 1.0})
    parsed = list(csv.DictReader(io.StringIO(ledger.to_csv(ledger.bench_results()))))
    assert [(r["profile"], float(r["tok_s"])) for r in parsed] == [("baseline", 90.0), ("cg_5tok", 82.3)]
    assert parsed[1]["notes"] == 'a "quoted", note'
    assert parsed[0]["accept_len_log"] == ""  # NULL stays empty, not "None"
    assert set(ledger.BENCH_COLUMNS) < set(parsed[0])


def _write_rows(db: str, writer: int, count: int) -> None:
    for i in range(count):
        ledger.record_bench(ok_row(f"w{writer}", float(i), 1.0), db=Path(db))


def test_two_writers_at_once_lose_nothing(state: Path) -> None:
    db = state / "ledger.sqlite"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_rows, args=(str(db), w, 150)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    rows = ledger.bench_results(db=db)
    assert sorted({r["profile"] for r in rows}) == ["w1", "w2"] and len(rows) == 300


def _open_new_ledgers(folder: str, count: int, barrier: object) -> None:
    try:
        for i in range(count):
            barrier.wait(timeout=30)  # type: ignore[attr-defined]
            with ledger.connect(Path(folder) / f"{i}.sqlite") as conn:
                conn.execute(sa.text("SELECT count(*) FROM bench_results")).scalar_one()
    except BaseException:
        barrier.abort()  # type: ignore[attr-defined]  # the others stop waiting for this one
        raise


def test_processes_opening_a_new_ledger_together_all_get_in(tmp_path: Path) -> None:
    # Switching a new ledger to WAL used to fail at once with "database is locked"
    # when another process switched it at the same moment (CI saw it once in ~300 runs).
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_open_new_ledgers, args=(str(tmp_path), 60, barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]


def test_plot_is_a_png_with_one_bar_per_profile_spanning_its_repeats(tmp_path: Path) -> None:
    import matplotlib.image

    for tok_s in (89.0, 90.0, 91.0):
        ledger.record_bench(ok_row("baseline", tok_s, 1.0))
    for tok_s in (82.0, 82.6):
        ledger.record_bench(ok_row("cg_5tok", tok_s, 2.12))
    ledger.record_bench(ok_row("cg_2step", 85.6, 2.19))
    ledger.record_bench(
        {"run_id": "f", "host": "lab2", "profile": "oom", "result": "failed"}
        | {
            "diagnosis": "CUDA out of memory",
        }
    )
    png = tmp_path / "tok_s.png"
    drawn = plot(ranking(ledger.bench_results(), "baseline"), "baseline", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(png).shape
    assert width > height > 300
    spans = [(b.profile, b.low, b.high, b.accept_len) for b in drawn]
    assert spans == [
        ("baseline", 89.0, 91.0, 1.0),
        ("cg_2step", 85.6, 85.6, 2.19),
        ("cg_5tok", 82.0, 82.6, 2.12),
    ]


def test_results_command_prints_table_csv_json_and_plots(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from orchestrator.cli.bench_commands import results

    ledger.record_bench(ok_row("baseline", 90.0, 1.0, git_commit="abcdef1234567890"))
    ledger.record_bench(ok_row("cg_5tok", 82.3, 2.12))
    runner = CliRunner()
    table = runner.invoke(results, [])
    assert table.exit_code == 0 and "cg_5tok" in table.output and "82.3" in table.output
    as_csv = runner.invoke(results, ["--format", "csv", "--profile", "cg_5tok"])
    assert as_csv.output.splitlines()[0].startswith("id,run_id,sweep_id,time,host")
    assert len(as_csv.output.splitlines()) == 2
    as_json = json.loads(runner.invoke(results, ["--format", "json", "--since", "1h"]).output)
    assert [r["profile"] for r in as_json] == ["baseline", "cg_5tok"]
    png = tmp_path / "plot.png"
    plotted = runner.invoke(results, ["--format", "csv", "--plot", str(png)])
    assert plotted.exit_code == 0 and png.read_bytes()[:4] == b"\x89PNG"
    bad = runner.invoke(results, ["--since", "last week"])
    assert bad.exit_code == 2 and "--since 'last week'" in bad.output


def test_a_plot_into_a_folder_that_does_not_exist_is_one_line_before_any_output(tmp_path: Path) -> None:
    """savefig raised FileNotFoundError after the table was printed: an internal error."""
    from click.testing import CliRunner

    from orchestrator.cli.bench_commands import results

    ledger.record_bench(ok_row("baseline", 90.0, 1.0))
    png = tmp_path / "no" / "such" / "plot.png"
    done = CliRunner().invoke(results, ["--plot", str(png)])
    assert done.exit_code == 2, done.output
    assert done.output == f"error: --plot {png}: no folder {png.parent} to write it in\n"
    (tmp_path / "file").write_text("")
    done = CliRunner().invoke(results, ["--plot", str(tmp_path / "file" / "plot.png")])
    assert (done.exit_code, done.output.count("\n")) == (2, 1), done.output
    done = CliRunner().invoke(results, ["--plot", str(tmp_path / ("x" * 300) / "plot.png")])
    assert (done.exit_code, done.output.count("\n")) == (2, 1), done.output
    assert "File name too long" in done.output


def test_the_results_table_shows_the_newest_rows_and_says_how_many_it_left_out(state: Path) -> None:
    """A team's ledger holds 100,000 rows: the table shows the newest --last N (200), the CSV all."""
    from click.testing import CliRunner

    from orchestrator.cli.main import cli

    with ledger.connect() as conn:
        rows = [{**ok_row("p", 80.0, 3.0), "time": 1.8e9 + i, "host": f"gpu-{i:03d}"} for i in range(205)]
        conn.execute(schema.bench_results.insert(), rows)
    table = CliRunner().invoke(cli, ["results"])
    assert table.exit_code == 0, table.output
    assert "5 older rows not shown: --last 0 shows them" in table.output
    assert "gpu-204" in table.output and "gpu-005" in table.output and "gpu-004" not in table.output
    everything = CliRunner().invoke(cli, ["results", "--last", "0"])
    assert "older rows" not in everything.output and "gpu-000" in everything.output
    csv_out = CliRunner().invoke(cli, ["results", "--format", "csv"])
    assert len(csv_out.output.splitlines()) == 206
