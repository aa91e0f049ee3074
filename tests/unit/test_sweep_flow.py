"""sweep's control flow with deploy and bench replaced by fakes: a failed start is recorded and
skipped, the fastest healthy profile (or --leave) is deployed last. The lab test runs it for real."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator import ledger
from orchestrator.hosts import deploy as deploy_mod
from orchestrator.hosts.host_report import DeployReport, HostReport
from orchestrator.tuning import bench, sweep

SPEEDS = {"baseline": 90.0, "cg_5tok": 82.3, "cg_2step": 85.6}


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path))
    deployed: list[str] = []

    def deploy(prof, inventory, options, on_event):
        ref = prof.name
        deployed.append(ref)
        ok = ref in SPEEDS
        step = "health" if not ok else "record"
        host = HostReport(host="lab2", ok=ok, step=step, changed=True, restarted=ok, healthy_after_s=1.0)
        if not ok:
            host.diagnosis, host.rolled_back_to = "CUDA out of memory: OutOfMemoryError", "cg_2step (abc)"
        return DeployReport(ref, "d", False, [host], "", "run")

    def run(target, settings, on_progress, log):
        rate = SPEEDS[deployed[-1]]
        s = bench.Stream(0.0, [(0.1, 1), (0.1 + 100 / rate, 101)], 1.2, verify_ct=50)
        return bench.BenchResult(target, settings, [s], 1.2, "0.5.9", deployed[-1] != "baseline", 2.0)

    monkeypatch.setattr(deploy_mod, "deploy", deploy)
    monkeypatch.setattr(
        bench, "deployed_target", lambda inv, limit, prof: bench.Target("lab2", "a", 1, prof.name)
    )
    monkeypatch.setattr(bench, "journal_messages", lambda inv, host: None)
    monkeypatch.setattr(bench, "run", run)
    return deployed


def _sweep(refs: list[str], inventory: Path, **kw) -> sweep.SweepReport:
    """As the CLI does: every profile named loaded once, then swept."""
    extra = [kw[k] for k in ("baseline", "leave") if kw.get(k)]
    return sweep.sweep(sweep.load_profiles([*refs, *extra]), refs, inventory, **kw)


def test_a_failed_profile_is_recorded_and_the_fastest_is_left(fakes: list[str]) -> None:
    report = _sweep(
        ["cg_5tok", "cg_2step", "cg_16tok"], Path("inv"), baseline="baseline", traffic=bench.Traffic(repeat=2)
    )
    assert fakes == ["baseline", "cg_5tok", "cg_2step", "cg_16tok", "baseline"]
    assert [e.profile for e in report.entries] == ["baseline", "cg_2step", "cg_5tok", "cg_16tok"]
    assert [len(e.tok_s) for e in report.entries] == [2, 2, 2, 0]
    assert report.entries[1].speedup == pytest.approx(85.6 / 90)
    assert "CUDA out of memory" in report.entries[-1].diagnosis
    assert "rolled back to cg_2step" in report.entries[-1].diagnosis
    assert (report.left, report.left_ok, fakes[-1]) == ("baseline", True, "baseline")
    rows = ledger.bench_results()
    assert {r["sweep_id"] for r in rows} == {report.sweep_id} and len(rows) == 7


def test_leave_names_the_profile_to_end_on(fakes: list[str]) -> None:
    report = _sweep(["cg_5tok", "cg_2step"], Path("inv"), leave="cg_5tok")
    assert fakes == ["cg_5tok", "cg_2step", "cg_5tok"]
    assert report.baseline == "cg_5tok"  # no `baseline` among them: the first one
    assert (report.left, report.left_ok) == ("cg_5tok", True)


def test_cli_takes_profiles_as_arguments_or_p_options_and_needs_one(fakes: list[str], tmp_path: Path) -> None:
    from click.testing import CliRunner

    from orchestrator.cli.bench_commands import sweep as sweep_cli

    inv = tmp_path / "inv.yml"
    inv.write_text("all: {hosts: {lab2: {}}}\n")
    done = CliRunner().invoke(sweep_cli, ["-i", str(inv), "cg_5tok", "-p", "cg_2step", "--json"])
    assert done.exit_code == 0, done.output
    assert fakes == ["cg_5tok", "cg_2step", "cg_2step"]  # swept in order, then the fastest left
    done = CliRunner().invoke(sweep_cli, ["-i", str(inv)])
    assert done.exit_code == 2 and "name the profiles to sweep" in done.output


def test_ctrl_c_during_a_deploy_stops_the_sweep(fakes: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.errors import Interrupted

    real = deploy_mod.deploy

    def interrupted_on_cg_2step(prof, inventory, options, on_event):
        report = real(prof, inventory, options, on_event)
        if prof.name == "cg_2step":
            report.interrupted, report.hosts[0].ok = True, False
            report.hosts[0].diagnosis = "interrupted (Ctrl-C) during health"
        return report

    monkeypatch.setattr(deploy_mod, "deploy", interrupted_on_cg_2step)
    with pytest.raises(Interrupted, match="stopped by Ctrl-C while deploying cg_2step"):
        _sweep(["cg_5tok", "cg_2step", "cg_16tok"], Path("inv"))
    assert fakes == ["cg_5tok", "cg_2step"]  # nothing after it, not even the restore of the fastest


def test_bench_says_where_a_run_stands_against_baseline_and_the_fastest(fakes: list[str]) -> None:
    from orchestrator.cli.bench_commands import standing_line

    _sweep(["baseline", "cg_2step"], Path("inv"))  # ledger: baseline 90.0, cg_2step 85.6 on lab2
    rate = SPEEDS["cg_5tok"]
    s = bench.Stream(0.0, [(0.1, 1), (0.1 + 100 / rate, 101)], 1.2, verify_ct=50)
    target = bench.Target("lab2", "a", 1, "cg_5tok")
    result = bench.BenchResult(target, bench.Settings(), [s], 1.2, "0.5.9", True, 2.0)
    assert standing_line(result) == (
        "in the ledger for lab2: 0.914x baseline (90.0 tok/s, 1 run(s)); "
        "fastest so far: baseline 90.0 tok/s (1 run(s))"
    )
    assert standing_line(replace(result, target=bench.Target("lab9", "a", 1, "cg_5tok"))) == ""


def test_a_sweep_loads_each_profile_once(fakes: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The CLI loads every profile it names once and passes the objects down (it was ~5 times each)."""
    from click.testing import CliRunner

    from orchestrator.cli.bench_commands import sweep as sweep_cli
    from orchestrator.profile import model as profile_mod

    loads: list[str] = []
    real = profile_mod.load
    monkeypatch.setattr(profile_mod, "load", lambda ref: loads.append(ref) or real(ref))
    inv = tmp_path / "inv.yml"
    inv.write_text("all: {hosts: {lab2: {}}}\n")
    args = ["-i", str(inv), "cg_5tok", "cg_2step", "--baseline", "baseline", "--leave", "cg_5tok", "--json"]
    done = CliRunner().invoke(sweep_cli, args)
    assert done.exit_code == 0, done.output
    assert sorted(loads) == ["baseline", "cg_2step", "cg_5tok"]


def test_over_several_levels_the_profile_left_is_best_over_all_of_them() -> None:
    def entry(profile: str, c: int, tok_s: float) -> sweep.Entry:
        level = sweep.level_of({"concurrency": c, "max_tokens": 64})
        return sweep.Entry(profile, ok=True, tok_s=[tok_s], level=level)

    # speculation wins alone and loses at 8 and 32: the baseline is better over the curve
    entries = [entry("eagle3", 1, 60), entry("base", 1, 50), entry("base", 8, 40), entry("eagle3", 8, 25)]
    entries += [entry("base", 32, 30), entry("eagle3", 32, 20)]
    assert sweep.best_profile(entries) == "base"
    assert sweep.best_profile(entries[:2]) == "eagle3"
    partial = [*entries, entry("fast_once", 1, 99)]  # measured at one level only
    assert sweep.best_profile(partial) == "base"
