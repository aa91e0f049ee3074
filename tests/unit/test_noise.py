"""Noise (issue 22): a mean with its 95% interval, Welch's verdicts against the baseline at the same
level only, `results` filtering by the traffic a row measured, and tok/s drawn against load."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from orchestrator import ledger
from orchestrator.cli.main import cli
from orchestrator.tuning import stats, sweep

#: Per-run relative deviations, mean 0 and standard deviation about 1: "1% noise" is 1 + 0.01 * z.
Z = (-1.3, -0.4, 0.2, 0.5, 1.0)
Z_OTHER = (0.9, -1.1, 0.6, -0.2, -0.2)


def runs(mean: float, noise: float, z: tuple[float, ...] = Z) -> list[float]:
    return [mean * (1 + noise * d) for d in z]


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


# --- stats ------------------------------------------------------------------------------------


def test_the_interval_is_students_t_as_scipy_computes_it() -> None:
    from scipy import stats as sp

    samples = [80.1, 81.3, 79.8, 80.6, 80.9]
    found = stats.interval(samples)
    low, high = sp.t.interval(0.95, len(samples) - 1, loc=sp.tmean(samples), scale=sp.sem(samples))
    assert (found.low, found.high) == (pytest.approx(low), pytest.approx(high))
    assert (
        found.mean == pytest.approx(80.54)
        and found.n == 5
        and found.half_width == pytest.approx(high - 80.54)
    )
    wider = stats.interval(samples, confidence=0.99)
    assert wider.low is not None and wider.low < found.low  # type: ignore[operator]
    assert stats.interval([82.3]) == stats.Interval(82.3, None, None, 1)
    assert stats.interval([90.0, 90.0, 90.0]) == stats.Interval(90.0, 90.0, 90.0, 3)
    with pytest.raises(ValueError):
        stats.interval([])


def test_welch_calls_a_clear_gap_and_not_noise() -> None:
    base = runs(90.0, 0.01)
    faster = stats.compare(runs(90.0 * 1.05, 0.01, Z_OTHER), base)
    assert faster.verdict == "faster" and faster.p_value is not None and faster.p_value < 0.001
    assert faster.ratio == pytest.approx(1.05, abs=0.005)
    assert stats.compare(base, runs(90.0 * 1.05, 0.01, Z_OTHER)).verdict == "slower"
    close = stats.compare(runs(90.0 * 1.005, 0.015, Z_OTHER), base)
    assert close.verdict == "within noise" and close.p_value is not None and close.p_value > 0.05
    from scipy import stats as sp

    expected = sp.ttest_ind(runs(90.0 * 1.005, 0.015, Z_OTHER), base, equal_var=False).pvalue
    assert close.p_value == pytest.approx(expected)


def test_one_run_on_either_side_is_too_few_and_still_gives_the_ratio() -> None:
    one = stats.compare([94.5], runs(90.0, 0.01))
    assert (one.verdict, one.p_value, one.ratio) == ("too few runs", None, pytest.approx(1.05, abs=0.01))
    assert stats.compare(runs(94.5, 0.01), [90.0]).verdict == "too few runs"


def test_runs_without_any_spread_are_decided_by_their_means() -> None:
    assert stats.compare([91.0, 91.0], [90.0, 90.0, 90.0]) == stats.Comparison("faster", 0.0, 91 / 90)
    assert stats.compare([90.0, 90.0], [90.0, 90.0]).verdict == "within noise"
    assert stats.compare([1.0, 2.0], [0.0, 0.0]).ratio is None  # no speed to divide by


# --- levels and ranking ---------------------------------------------------------------------


def row(profile: str, tok_s: float | None, **more: Any) -> dict[str, Any]:
    """A ledger row as bench records it; defaults as the columns have them."""
    level = {"endpoint": "generate", "dataset": "", "dataset_digest": "", "concurrency": 1}
    level |= {"request_rate": None, "temperature": 0.0, "max_tokens": 256}
    return (
        {
            "run_id": "r",
            "host": "lab2",
            "profile": profile,
            "result": "ok" if tok_s is not None else "failed",
            "tok_s": tok_s,
            "speculative": int(profile != "baseline"),
            "accept_len": 1.0 if profile == "baseline" else 2.1,
            "diagnosis": "" if tok_s is not None else "CUDA out of memory",
        }
        | level
        | more
    )


def test_entries_carry_their_interval_and_verdict_against_the_baseline() -> None:
    rows = [row("baseline", t) for t in runs(90.0, 0.01)]
    rows += [row("cg_5tok", t) for t in runs(94.5, 0.01, Z_OTHER)]
    rows += [row("cg_2step", t) for t in runs(90.45, 0.015, Z_OTHER)]
    rows += [row("cg_16tok", 92.0), row("oom", None, concurrency=0, max_tokens=0)]
    entries = sweep.ranking(rows, "baseline")
    assert [e.profile for e in entries] == ["cg_5tok", "cg_16tok", "cg_2step", "baseline", "oom"]
    by = {e.profile: e for e in entries}
    assert [by[p].verdict for p in ("cg_5tok", "cg_16tok", "cg_2step")] == [
        "faster",
        "too few runs",
        "within noise",
    ]
    assert by["baseline"].verdict is None and by["oom"].verdict is None and by["oom"].level is None
    assert by["cg_5tok"].interval == stats.interval(by["cg_5tok"].tok_s)
    assert by["cg_5tok"].speedup == pytest.approx(by["cg_5tok"].mean / by["baseline"].mean)
    assert by["cg_16tok"].interval == stats.Interval(92.0, None, None, 1)


@pytest.mark.parametrize(
    "other",
    [
        {"concurrency": 8},
        {"endpoint": "chat"},
        {"dataset": "sharegpt", "dataset_digest": "9c1e77aa01"},
        {"temperature": 0.7},
        {"max_tokens": 512},
        {"request_rate": 4.0},
    ],
    ids=lambda v: next(iter(v)),
)
def test_rows_of_another_level_are_never_compared(other: dict[str, Any]) -> None:
    """A profile benched only at another level has no baseline there: no speed-up, no verdict."""
    rows = [row("baseline", t) for t in runs(90.0, 0.01)]
    rows += [row("cg_5tok", t) for t in runs(94.5, 0.01, Z_OTHER)]
    rows += [row("cg_5tok", t, **other) for t in runs(50.0, 0.01)]
    entries = sweep.ranking(rows, "baseline")
    here = [e for e in entries if e.level == sweep.level_of(rows[0])]
    [there] = [e for e in entries if e.level != sweep.level_of(rows[0])]
    assert [(e.profile, e.verdict) for e in here] == [("cg_5tok", "faster"), ("baseline", None)]
    assert here[0].tok_s == runs(94.5, 0.01, Z_OTHER) and there.level == sweep.level_of(rows[-1])
    assert (there.verdict, there.speedup, len(there.tok_s)) == (None, None, 5)


def test_old_rows_read_as_the_columns_defaults_and_form_their_own_level() -> None:
    old = {"profile": "baseline", "result": "ok", "tok_s": 90.0, "speculative": 0, "accept_len": None}
    old |= {"diagnosis": "", "concurrency": 1, "max_tokens": 256}
    assert sweep.level_of(old) == sweep.Level("generate", "", 1, None, 0.0, 256)
    assert sweep.level_of(old) != sweep.level_of(row("x", 1.0, dataset_digest="abc"))
    assert sweep.Level(concurrency=8).label() == "generate, built-in prompts, T=0, 0 tokens, c=8"
    rate = sweep.Level("chat", "9c1e77aa01", 64, 4.0, 0.7, 256, dataset="sharegpt")
    assert rate.label() == "chat, sharegpt 9c1e77aa, T=0.7, 256 tokens, c<=64, 4/s"


def test_curves_hold_each_profile_by_load_the_baseline_first() -> None:
    rows = []
    for c, scale in ((4, 0.8), (1, 1.0), (16, 0.5)):
        rows += [row("cg_5tok", t, concurrency=c) for t in runs(95.0 * scale, 0.01)]
        rows += [row("baseline", t, concurrency=c) for t in runs(90.0 * scale, 0.01, Z_OTHER)]
    rows += [row("cg_5tok", 70.0, endpoint="chat", concurrency=2)]
    found = sweep.curves(rows, "baseline")
    assert [(c.profile, c.axis, [e.level.x for e in c.entries]) for c in found] == [  # type: ignore[union-attr]
        ("cg_5tok", "concurrency", [2.0]),  # chat's series sorts before generate's
        ("baseline", "concurrency", [1.0, 4.0, 16.0]),
        ("cg_5tok", "concurrency", [1.0, 4.0, 16.0]),
    ]
    assert found[0].workload == "chat, built-in prompts, T=0, 256 tokens"
    assert [e.verdict for e in found[2].entries] == ["faster"] * 3
    assert [e.verdict for e in found[0].entries] == [None]  # no baseline on that endpoint


def test_standing_compares_like_with_like(state: Path) -> None:
    for t in runs(90.0, 0.01):
        ledger.record_bench(row("baseline", t))
    ledger.record_bench(row("baseline", 40.0, concurrency=8))
    ledger.record_bench(row("cg_2step", 95.0, concurrency=8))
    base, best = sweep.standing("lab2", level=sweep.level_of(row("x", 1.0, concurrency=8)))
    assert base is not None and best is not None and (base.mean, best.profile) == (40.0, "cg_2step")
    base, _ = sweep.standing("lab2", level=sweep.level_of(row("x", 1.0)))
    assert base is not None and len(base.tok_s) == 5
    # No level given: that of the host's newest run (c=8 here).
    assert sweep.standing("lab2")[0].mean == 40.0  # type: ignore[union-attr]


# --- the CLI ----------------------------------------------------------------------------------


def record_traffic() -> None:
    """Two datasets and endpoints, three loads, a temperature and seeds, with repeats."""
    sharegpt = {"dataset": "sharegpt", "dataset_digest": "9c1e77aa0123"}
    for c, scale in ((1, 1.0), (4, 0.8), (16, 0.5)):
        for k, (zb, zc) in enumerate(zip(Z, Z_OTHER, strict=True)):
            seed = {"seed": k, "repeat": k, "concurrency": c}
            ledger.record_bench(row("baseline", 90.0 * scale * (1 + 0.01 * zb), **sharegpt, **seed))
            ledger.record_bench(row("cg_5tok", 94.5 * scale * (1 + 0.01 * zc), **sharegpt, **seed))
    ledger.record_bench(row("cg_5tok", 60.0, endpoint="chat", temperature=0.7, seed=9))
    ledger.record_bench(row("baseline", 30.0, request_rate=2.5, concurrency=64))


def results(*args: str) -> Any:
    done = CliRunner().invoke(cli, ["results", *args])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout) if "json" in args else done.stdout


@pytest.mark.parametrize(
    ("args", "count"),
    [
        ([], 32),
        (["--endpoint", "chat"], 1),
        (["--endpoint", "generate"], 31),
        (["--dataset", "sharegpt"], 30),
        (["--dataset", "9c1e77aa0123"], 30),
        (["--dataset", "9c1e77"], 30),
        (["--dataset", "9c1e7"], 0),  # too short to be a digest's start
        (["--dataset", ""], 2),  # the built-in prompts
        (["--concurrency", "4"], 10),
        (["-c", "64"], 1),
        (["--request-rate", "2.5"], 1),
        (["--temperature", "0.7"], 1),
        (["--temperature", "0"], 31),
        (["--seed", "3"], 6),
        (["--seed", "3", "--concurrency", "16", "--profile", "cg_5tok"], 1),
    ],
)
def test_results_filter_by_the_traffic_a_row_measured(args: list[str], count: int) -> None:
    record_traffic()
    assert len(results("--format", "json", *args)) == count
    csv_lines = results("--format", "csv", *args).splitlines()
    assert len(csv_lines) == (count + 1 if count else 0)


def test_results_compare_each_level_with_the_baseline_and_name_the_method() -> None:
    record_traffic()
    text = results("--dataset", "sharegpt")
    assert text.count("against baseline at generate, sharegpt 9c1e77aa, T=0, 256 tokens, c=") == 3
    assert text.count("faster (p<0.001)") == 3 and "Welch's t-test on per-run mean tok/s, p < 0.05" in text
    assert "94.5 ± " in text and "1.050x" in text
    one_run = results("--seed", "0", "--dataset", "sharegpt")
    assert one_run.count("too few runs") == 3 and "faster" not in one_run
    alone = results("--endpoint", "chat")
    assert "no baseline runs among these rows" in alone


def test_results_json_rows_carry_their_comparison() -> None:
    record_traffic()
    rows = results("--format", "json", "-c", "4")
    assert {r["concurrency"] for r in rows} == {4}
    cg = next(r for r in rows if r["profile"] == "cg_5tok")["comparison"]
    assert (cg["verdict"], cg["runs"], cg["baseline"], cg["method"]) == (
        "faster",
        5,
        "baseline",
        stats.METHOD,
    )
    assert cg["ci95_low"] < cg["mean_tok_s"] < cg["ci95_high"] and cg["p_value"] < 0.001
    assert cg["level"]["concurrency"] == 4 and cg["level"]["dataset"] == "sharegpt"
    base = next(r for r in rows if r["profile"] == "baseline")["comparison"]
    assert (base["verdict"], base["speedup"]) == ("baseline", 1.0)
    [chat] = results("--format", "json", "--endpoint", "chat")
    assert chat["comparison"]["baseline"] is None and chat["comparison"]["verdict"] is None
    failed = {"run_id": "f", "host": "lab2", "profile": "oom", "result": "failed", "diagnosis": "x"}
    ledger.record_bench(failed)
    assert results("--format", "json", "--profile", "oom")[0]["comparison"] is None


def test_an_older_ledger_read_as_it_is_filters_on_the_defaults(state: Path) -> None:
    """A version-3 ledger (no traffic columns) that `results` may only read, not migrate."""
    state.mkdir(parents=True)
    path = Path(__file__).parents[1] / "data" / "ledgers" / "legacy_migrations.py"
    spec = importlib.util.spec_from_file_location("legacy_migrations", path)
    assert spec is not None and spec.loader is not None
    legacy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(legacy)
    legacy.make_ledger(ledger.path(), 3)
    with sqlite3.connect(ledger.path()) as conn:
        conn.execute(
            "INSERT INTO bench_results (run_id, time, host, profile, result, concurrency, tok_s)"
            " VALUES ('r', 1.8e9, 'lab2', 'baseline', 'ok', 2, 90.0)"
        )
    [old] = results("--format", "json", "--endpoint", "generate", "--temperature", "0", "-c", "2")
    assert (old["endpoint"], old["dataset"], old["request_rate"], old["seed"]) == ("generate", "", None, None)
    assert results("--format", "json", "--endpoint", "chat") == []
    assert results("--format", "json", "--seed", "1") == []
    assert "generate" in results()
    with sqlite3.connect(ledger.path()) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3  # not migrated by a read
        assert conn.execute("SELECT name FROM sqlite_master WHERE name='alembic_version'").fetchall() == []


def test_sweep_json_and_table_show_the_interval_and_verdict() -> None:
    from orchestrator.cli.bench_commands import _sweep_json, ranking_table
    from orchestrator.cli.console import out

    rows = [row("baseline", t) for t in runs(90.0, 0.01)] + [row("cg_5tok", 92.0)]
    report = sweep.SweepReport("s1", "baseline", sweep.ranking(rows, "baseline"))
    got = _sweep_json(report)
    assert got["method"] == stats.METHOD
    cg, base = got["ranking"]
    assert (cg["profile"], cg["verdict"], cg["runs"], cg["ci95_low"]) == ("cg_5tok", "too few runs", 1, None)
    assert base["verdict"] == "baseline" and base["ci95_low"] < 90.0 < base["ci95_high"]
    with out.capture() as captured:
        out.print(ranking_table(report.entries, "baseline", "sweep s1"))
    text = captured.get()
    assert "too few runs" in text and "90.0 ± 1.0" in text and "faster" not in text


def test_results_plot_draws_a_line_per_profile_against_concurrency(tmp_path: Path) -> None:
    from orchestrator.tuning import plot

    record_traffic()
    rows = [dict(r) for r in ledger.bench_results(dataset="sharegpt")]
    curves = sweep.curves(rows, "baseline")
    assert plot.spans_loads(curves)
    png = tmp_path / "curve.png"
    drawn = plot.plot_curves(curves, "baseline", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [(line.profile, line.baseline, line.x) for line in drawn] == [
        ("baseline", True, (1.0, 4.0, 16.0)),
        ("cg_5tok", False, (1.0, 4.0, 16.0)),
    ]
    expected = stats.interval([90.0 * 0.8 * (1 + 0.01 * z) for z in Z])
    assert (drawn[0].mean[1], drawn[0].low[1], drawn[0].high[1]) == pytest.approx(
        (expected.mean, expected.low, expected.high)
    )
    # One run at each load: a line without error bars.
    single = plot.lines(sweep.curves([r for r in rows if r["seed"] == 0], "baseline"), "baseline")
    assert all(line.low == (None, None, None) for line in single)
    done = CliRunner().invoke(cli, ["results", "--dataset", "sharegpt", "--plot", str(png)])
    assert done.exit_code == 0 and "(2 lines of tok/s against load)" in done.stderr, done.output
    # One load: the bar chart, as before.
    done = CliRunner().invoke(cli, ["results", "--dataset", "sharegpt", "-c", "4", "--plot", str(png)])
    assert done.exit_code == 0 and "(2 profiles)" in done.stderr, done.output


def test_a_benchs_standing_line_reads_only_its_own_level() -> None:
    from dataclasses import replace

    from orchestrator.cli.bench_commands import standing_line
    from orchestrator.tuning import bench

    for t in runs(90.0, 0.01):
        ledger.record_bench(row("baseline", t))
    stream = bench.Stream(0.0, [(0.1, 1), (0.1 + 100 / 80.0, 101)], 1.2, verify_ct=50)
    target = bench.Target("lab2", "a", 1, "cg_5tok")
    result = bench.BenchResult(target, bench.Settings(concurrency=1), [stream], 1.2, "0.5.9", True, 2.0)
    assert "x baseline (90.0 tok/s, 5 run(s))" in standing_line(result)
    assert standing_line(replace(result, settings=bench.Settings(concurrency=8))) == ""
