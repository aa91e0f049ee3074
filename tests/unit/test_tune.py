"""tune's search with deploy and bench replaced by fakes that run at the stand-in's own speed model
(orchestrator/lab/standins/host/sglang/_speed.py) with its run-to-run noise and host factors.

What needs no host lives here: which points are tried, early stopping, the budget, the per-host
baselines, ties, resume, the winner's file. tests/lab/test_tune_lab.py runs a small space for real.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import tunesim
import yaml
from tunesim import GRID, Lab, model_tok_s

from orchestrator import ledger
from orchestrator.errors import InputError, Interrupted, ProfileError
from orchestrator.hosts import deploy as deploy_mod
from orchestrator.hosts import preflight_play
from orchestrator.tuning import bench, space, tune


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lab:
    return installed(monkeypatch, tmp_path / "state")


def installed(monkeypatch: pytest.MonkeyPatch, state: Path) -> Lab:
    """The in-memory lab in place of deploy, bench and the journal, its ledger in `state`."""
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(state))
    monkeypatch.setenv("SGLANG_STANDIN_EXACT", "1")
    fake = Lab({"lab1": 1.0, "lab2": 0.96})
    monkeypatch.setattr(deploy_mod, "deploy", fake.deploy)
    monkeypatch.setattr(preflight_play, "require_same_files_on", fake.same_files)
    monkeypatch.setattr(bench, "run", fake.run)
    monkeypatch.setattr(bench, "deployed_target", target_of)
    monkeypatch.setattr(bench, "journal_lines", fake.journal_lines)
    return fake


def target_of(inventory: Any, host: str, prof: Any) -> bench.Target:
    """The deployed server, with the digest of the unit its profile renders (as the real one)."""
    from orchestrator.render import launch

    digest = launch.build(prof).digest
    return bench.Target(host, "a", 1, prof.name, digest, digest)


def write_space(folder: Path, vary: dict[str, list[Any]] | None = None, **over: Any) -> Path:
    data: dict[str, Any] = {
        "extends": "example:cg_5tok",
        "baseline": "example:baseline",
        "vary": vary or GRID,
        "traffic": {"concurrency": [1, 8], "requests": 4, "max_tokens": 16, "repeat": 2},
        "objective": {"maximize": "tok_s", "at_concurrency": 1},
        "budget": {"restarts": 10},
        "search": {"seed": 1},
    }
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    path = folder / "space.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def campaign(path: Path, hosts: list[str], tmp_path: Path, **kw: Any) -> tune.Campaign:
    options = tune.Options(leave=kw.pop("leave", "best"), profiles_dir=tmp_path / "profiles")
    return tune.Campaign(space.expand(path), Path("inv"), hosts, options, **kw)


def true_best(x: space.Expanded, concurrency: int = 1) -> float:
    return max(model_tok_s(p.profile, concurrency) for p in x.valid)


# --- the space file ---------------------------------------------------------------------------


def test_the_grid_expands_through_the_profile_rules(tmp_path: Path) -> None:
    x = space.expand(write_space(tmp_path))
    assert (len(x.points), len(x.valid), len(x.pruned)) == (60, 29, 31)
    pruned = {p.label: p.pruned for p in x.pruned}
    assert (
        "SGLang silently replaces num_draft_tokens 4 by num_steps + 1 = 2"
        in pruned["num_steps=1 eagle_topk=1 num_draft_tokens=4"]
    )
    assert (
        "16 exceeds num_steps x eagle_topk + 1 = 11" in pruned["num_steps=5 eagle_topk=2 num_draft_tokens=16"]
    )
    one = next(p for p in x.valid if p.label == "num_steps=3 eagle_topk=2 num_draft_tokens=5")
    assert one.name == "cg_5tok.3-2-5"
    assert (one.profile.speculative.num_steps, one.profile.speculative.eagle_topk) == (3, 2)
    assert one.profile.speculative.algorithm == "EAGLE3"  # the rest is the extended profile's


@pytest.mark.parametrize(
    ("vary", "over", "message"),
    [
        ({"speculative.num_step": [1]}, {}, "speculative has no field 'num_step': did you mean 'num_steps'?"),
        ({"name": ["x"]}, {}, "name is the same for every trial of a campaign"),
        ({"speculative": [1]}, {}, "speculative is a section: name one of its fields"),
        ({"server.port.x": [1]}, {}, "server.port is a value, not a section"),
        ({"speculative.num_steps": [2, 2]}, {}, "2 given twice"),
        (
            {"speculative.num_steps": [2]},
            {"objective": {"at_concurrency": 4}},
            "not a level of traffic.concurrency",
        ),
        ({"speculative.num_steps": [2]}, {"budget": {"restarts": 0}}, "budget.restarts"),
        ({"speculative.num_steps": [2]}, {"tarffic": {}}, "unknown key; did you mean 'traffic'?"),
    ],
)
def test_a_bad_space_names_what_to_fix(tmp_path: Path, vary: dict, over: dict, message: str) -> None:
    path = write_space(tmp_path, vary, **over)
    with pytest.raises(ProfileError) as exc:
        space.load(path)
    assert message in str(exc.value)


def test_a_varied_value_reaches_the_profile_as_written(tmp_path: Path) -> None:
    path = tmp_path / "space.yml"
    path.write_text(
        "extends: example:cg_5tok\nbaseline: example:baseline\n"
        "vary:\n  env.SGLANG_VERSION_TAG: [1.10, 1.1]\n  server.cuda_graph: [false, null]\n"
    )
    x = space.expand(path)
    tags = {p.label: p.profile.env["SGLANG_VERSION_TAG"] for p in x.valid}
    assert tags["SGLANG_VERSION_TAG=1.10 cuda_graph=off"] == "1.10"  # not YAML 1.1's 1.1
    assert tags["SGLANG_VERSION_TAG=1.1 cuda_graph=off"] == "1.1"
    assert len({p.name for p in x.valid}) == 4  # 1.10 and 1.1 are two points
    graphs = {p.label: p.profile.server.cuda_graph for p in x.valid}
    assert graphs["SGLANG_VERSION_TAG=1.10 cuda_graph=default"] is True  # null: the extended profile's


def test_the_winner_file_keeps_each_number_as_written() -> None:
    from orchestrator.profile import yaml12

    text = tune._dump(
        {"env": {"A": yaml12.Float(1.1, "1.10")}, "speculative": {"num_steps": yaml12.Int(3, "3")}}
    )
    assert "A: 1.10\n" in text and "num_steps: 3\n" in text


def test_the_space_schema_is_published() -> None:
    from click.testing import CliRunner

    from orchestrator.cli.main import cli

    result = CliRunner().invoke(cli, ["schema", "space"])
    assert result.exit_code == 0
    assert '"vary"' in result.output and '"budget"' in result.output


# --- the search ---------------------------------------------------------------------------------


def test_tune_finds_the_grid_winner_with_a_third_of_its_restarts(lab: Lab, tmp_path: Path) -> None:
    path = write_space(tmp_path)
    outcome = campaign(path, ["lab1"], tmp_path).run()
    x = space.expand(path)
    best = true_best(x)
    assert outcome.restarts <= len(x.valid) / 3 + 1
    assert outcome.winner is not None
    assert model_tok_s(outcome.winner.profile, 1) >= best * 0.97  # the winner or one within noise of it
    states = [t.state for t in outcome.trials if t.kind == "trial"]
    assert "stopped" in states  # a clearly worse point got one run, not the curve
    # the deploys asked for: the baseline, trials, and the one left at the end
    assert lab.deploys[0] == {"lab1": "baseline"} and len(lab.deploys) <= outcome.restarts + 1
    assert "beats the baseline" in outcome.verdict and outcome.winner_beats_baseline
    assert outcome.left == Path(outcome.winner_file).stem  # what runs is named as the file


def test_the_space_profile_own_setting_is_measured_first_and_named_in_the_verdict(
    lab: Lab, tmp_path: Path
) -> None:
    """A campaign answers "does anything beat what runs today": the point that runs as the space's
    profile does (cg_16tok is 5/4/16) is the first trial, and the verdict says how it did."""
    path = write_space(tmp_path, extends="example:cg_16tok", budget={"restarts": 8})
    x = space.expand(path)
    assert x.incumbent is not None and x.incumbent.name == "cg_16tok.5-4-16"
    outcome = campaign(path, ["lab1"], tmp_path).run()
    assert lab.deploys[1] == {"lab1": "cg_16tok.5-4-16"}
    assert outcome.winner is not None and outcome.winner.profile.name != "cg_16tok.5-4-16"
    assert "; cg_16tok's own setting (num_steps=5 eagle_topk=4 num_draft_tokens=16): 1.0" in outcome.verdict


def test_a_space_without_the_profile_own_setting_has_no_incumbent(tmp_path: Path) -> None:
    x = space.expand(write_space(tmp_path, {"speculative.num_draft_tokens": [8, 16]}))
    assert x.incumbent is None  # cg_5tok verifies 5 draft tokens


def test_numbers_are_ordered_for_the_search_and_other_values_are_not(lab: Lab, tmp_path: Path) -> None:
    """The search spreads its first points by each field's order: numbers by value, whatever order
    the file lists them in; booleans, strings and a null among numbers by position."""
    from orchestrator.tuning import search

    scale = search.rank_scales({"d": [16, 2, 5], "b": [True, False], "n": [2, None]})
    assert [scale["d"](v) for v in (2, 5, 16)] == [0.0, 0.5, 1.0]
    assert [scale["b"](v) for v in (True, False)] == [0.0, 1.0]
    assert [scale["n"](v) for v in (2, None)] == [0.0, 1.0]
    vary = {"speculative.num_draft_tokens": [8, 4, 5], "server.cuda_graph": [True, False]}
    path = write_space(tmp_path, vary, budget={"restarts": 7}, search={"sampler": "grid", "confirm": 0})
    outcome = campaign(path, ["lab1"], tmp_path, leave="none").run()
    tried = sorted(space.point_key(t.params) for t in outcome.trials if t.kind == "trial")
    assert tried == sorted(p.key for p in space.expand(path).valid)  # each point once, none twice


def test_two_hosts_share_one_baseline_and_the_fit_finds_their_speeds(lab: Lab, tmp_path: Path) -> None:
    """lab2 is a tenth slower at everything. Only lab1 measures the baseline; the model's host
    factors put lab2's trials on lab1's scale, so each value is the point's own speed-up."""
    lab.factor = {"lab1": 1.0, "lab2": 0.9}
    path = write_space(tmp_path, budget={"restarts": 9})
    outcome = campaign(path, ["lab1", "lab2"], tmp_path).run()
    baselines = [d for d in lab.deploys if "baseline" in d.values()]
    assert len(baselines) <= 2  # the measurement, and at most the end's --leave
    assert sum(1 for t in outcome.trials if t.kind == "baseline") == 1
    assert {t.host for t in outcome.trials if t.kind == "trial"} == {"lab1", "lab2"}
    # hosts that start together share one play: the baseline on one, the first point on the other
    assert sorted(lab.deploys[0].values())[0] == "baseline" and len(lab.deploys[0]) == 2
    assert outcome.model is not None
    assert outcome.model.hosts["lab2"] / outcome.model.hosts["lab1"] == pytest.approx(0.9, abs=0.03)
    for t in outcome.trials:
        if t.kind == "trial" and t.state == "complete" and t.host == "lab2":
            expected = model_tok_s(t.profile, 1) / 90.0
            assert t.value == pytest.approx(expected, rel=0.05), t.label  # not 0.9x of it


def test_hosts_with_other_model_files_stop_the_campaign_before_its_first_restart(
    lab: Lab, tmp_path: Path
) -> None:
    """Two drafters on two hosts would be measured as host noise: the files are compared once,
    before anything stops, and a difference ends the campaign there, naming the host."""
    path = write_space(tmp_path, budget={"restarts": 9})
    campaign(path, ["lab1"], tmp_path).run()
    assert lab.files_checked == []  # one host: nothing to compare
    lab.deploys.clear()
    lab.other_files = "lab2"
    with pytest.raises(preflight_play.FilesDiffer, match=r"lab2: speculative\.draft_model_path"):
        campaign(path, ["lab1", "lab2"], tmp_path).run()
    assert lab.files_checked == [["lab1", "lab2"]]  # once, with the trials' drafter
    assert lab.deploys == []  # nothing was stopped


def test_a_trial_that_fails_to_start_is_recorded_and_the_campaign_goes_on(lab: Lab, tmp_path: Path) -> None:
    path = write_space(
        tmp_path,
        {"speculative.num_steps": [2, 3], "env.FAIL": [None, "1"]},
        budget={"restarts": 6},
        search={"sampler": "grid", "seed": 1},
    )
    outcome = campaign(path, ["lab1"], tmp_path).run()
    failed = [t for t in outcome.trials if t.state == "failed"]
    assert failed and all("CUDA out of memory" in t.diagnosis for t in failed)
    assert all(t.params["env.FAIL"] == "1" for t in failed)
    assert outcome.winner is not None and outcome.winner.params["env.FAIL"] is None
    rows = ledger.trials(outcome.campaign_id)
    assert any(r["state"] == "failed" and "CUDA out of memory" in r["diagnosis"] for r in rows)


def test_a_tie_is_reported_as_one(lab: Lab, tmp_path: Path) -> None:
    # 3 steps, 5 draft tokens: top-k 2 and 4 build the same tree in the model, the same speed
    path = write_space(
        tmp_path,
        {"speculative.eagle_topk": [2, 4]},
        search={"sampler": "grid", "confirm": 2},
        budget={"restarts": 6},
    )
    outcome = campaign(path, ["lab1"], tmp_path).run()
    assert outcome.leaders == "tie"
    extra = [t for t in outcome.trials if t.kind == "confirm"]
    assert 1 <= len(extra) <= 4


def test_an_interrupted_campaign_resumes_without_measuring_again(lab: Lab, tmp_path: Path) -> None:
    path = write_space(tmp_path, budget={"restarts": 8})
    first = campaign(path, ["lab1"], tmp_path)
    lab.interrupt_at = 4  # the baseline and two trials done, Ctrl-C during the third trial's deploy
    with pytest.raises(Interrupted, match=f"--resume {first.id}"):
        first.run()
    assert ledger.campaign(first.id)["status"] == "interrupted"
    before = [d for d in lab.deploys[:3]]
    measured = {r["profile"] for r in ledger.trials(first.id)}
    assert len(measured) == 3
    lab.interrupt_at = None
    lab.deploys.clear()
    outcome = campaign(path, [], tmp_path, resume=first.id).run()
    after = ledger.trials(first.id)[len(measured) :]
    searched = {r["profile"] for r in after if r["kind"] == "trial"}
    assert searched and not searched & measured, (before, searched)  # no point searched twice
    assert not [r for r in after if r["kind"] == "baseline"]  # nor the baseline measured again
    assert {"lab1": "baseline"} not in lab.deploys[:-1]
    confirmed = {r["profile"] for r in after if r["kind"] == "confirm"}
    assert confirmed <= {t.profile.name for t in outcome.trials if t.kind == "trial"}
    assert outcome.restarts <= 8
    assert ledger.campaign(first.id)["status"] == "done"


def test_resume_refuses_another_space_file(lab: Lab, tmp_path: Path) -> None:
    path = write_space(tmp_path, budget={"restarts": 3})
    done = campaign(path, ["lab1"], tmp_path).run()
    write_space(tmp_path, budget={"restarts": 4})
    with pytest.raises(InputError, match="not the file campaign"):
        campaign(path, [], tmp_path, resume=done.campaign_id).run()


def test_the_winner_file_extends_the_space_profile_and_never_overwrites(lab: Lab, tmp_path: Path) -> None:
    path = write_space(
        tmp_path,
        {"speculative.num_steps": [2, 3], "speculative.num_draft_tokens": [4, 5]},
        budget={"restarts": 5},
    )
    c = campaign(path, ["lab1"], tmp_path)
    folder = tmp_path / "profiles"
    folder.mkdir()
    taken = folder / f"cg_5tok-tuned-{c.id[:6]}.yml"
    taken.write_text("# mine\n")
    outcome = c.run()
    assert outcome.winner_file.endswith(f"cg_5tok-tuned-{c.id[:6]}-2.yml")
    assert taken.read_text() == "# mine\n"
    data = yaml.safe_load(Path(outcome.winner_file).read_text())
    assert data["extends"] == "example:cg_5tok"
    assert data["speculative"] == {
        "num_steps": outcome.winner.params["speculative.num_steps"],
        "num_draft_tokens": outcome.winner.params["speculative.num_draft_tokens"],
    }
    from orchestrator.profile import model as profile_mod

    prof = profile_mod.load(outcome.winner_file)
    assert prof.speculative.eagle_topk == 4  # the rest comes from cg_5tok


def test_check_estimates_from_the_ledger(lab: Lab, tmp_path: Path) -> None:
    path = write_space(tmp_path)
    x = space.expand(path)
    guess = tune.estimate(x, 1)
    assert "a guess" in guess.basis
    for seconds in (30.0, 40.0, 50.0):
        ledger.record_deploy(
            ledger.DeployRow(
                "r", "lab1", "sglang.service", "baseline", "d", "deploy", "healthy", True, seconds
            )
        )
    one, four = tune.estimate(x, 1), tune.estimate(x, 4)
    assert one.restart_s == 40.0 and "median of the ledger's last 3 restarting deploys" in one.basis
    assert one.restarts == 10 and four.restarts == 10
    assert (one.trials, four.trials) == (8, 8)  # one baseline for all hosts, and the confirmation's
    assert four.wall_s < one.wall_s / 2  # four hosts work at once


def test_check_says_one_baseline_serves_every_host(lab: Lab, tmp_path: Path) -> None:
    """More hosts finish sooner and search as many points: the baseline is measured once, and the
    model's host factors put every host on its scale. --check says so before any restart."""
    from click.testing import CliRunner

    from orchestrator.cli.main import cli

    path = write_space(tmp_path, budget={"restarts": 11})
    argv = ["tune", str(path), "-i", str(tmp_path / "inv.yml"), "--check"]
    (tmp_path / "inv.yml").write_text(
        "all:\n  hosts:\n    lab1: {}\n    lab2: {}\n    lab3: {}\n    lab4: {}\n"
    )
    four = CliRunner().invoke(cli, [*argv, "--limit", "lab1,lab2,lab3,lab4"])
    said = " ".join(four.output.split())
    assert four.exit_code == 0, four.output
    assert "objective: maximize tok/s of one request at c=1, against baseline" in said
    assert "9 or 10 points measured, one baseline on the first host free" in said
    one = CliRunner().invoke(cli, [*argv, "--limit", "lab1"])
    assert one.exit_code == 0 and "9 or 10 points measured" in " ".join(one.output.split())


def test_a_null_winner_is_written_as_null_and_means_the_default(lab: Lab, tmp_path: Path) -> None:
    from orchestrator.profile import model as profile_mod

    path = write_space(tmp_path, {"server.cuda_graph": [None]}, budget={"restarts": 3})
    outcome = campaign(path, ["lab1"], tmp_path).run()
    data = yaml.safe_load(Path(outcome.winner_file).read_text())
    assert data["server"] == {"cuda_graph": None}
    assert profile_mod.load(outcome.winner_file).server.cuda_graph == outcome.winner.profile.server.cuda_graph


def test_values_that_read_alike_in_a_name_are_two_trials(tmp_path: Path) -> None:
    x = space.expand(write_space(tmp_path, {"env.X": ["a b", "a_b", "a/b", "on"]}))
    assert len({p.name for p in x.valid}) == 4


def test_a_budget_below_a_baseline_and_a_trial_is_refused(lab: Lab, tmp_path: Path) -> None:
    """The baseline takes one restart and the leaders' confirmation keeps one: 2 measures nothing."""
    path = write_space(tmp_path, budget={"restarts": 2})
    with pytest.raises(InputError, match=r"budget.restarts 2 measures no point: .*raise it to at least 3"):
        campaign(path, ["lab1", "lab2"], tmp_path).run()
    assert lab.deploys == []


def test_ctrl_c_mid_round_records_the_trials_that_finished(lab: Lab, tmp_path: Path, monkeypatch) -> None:
    path = write_space(tmp_path, budget={"restarts": 8})
    c = campaign(path, ["lab1", "lab2"], tmp_path)
    real = lab.run

    def run(target, settings, on_progress, log=None, **kw):
        if target.host == "lab2" and lab.running["lab2"].name != "baseline":
            deadline = time.monotonic() + 30
            while not any(t.kind == "baseline" for t in c.trials) and time.monotonic() < deadline:
                time.sleep(0.01)  # lab1 measures the baseline meanwhile
            raise KeyboardInterrupt  # as Ctrl-C lands in the main thread while lab2 benches
        return real(target, settings, on_progress, log, **kw)

    monkeypatch.setattr(bench, "run", run)
    with pytest.raises((Interrupted, KeyboardInterrupt)):
        c.run()
    kinds = [(r["kind"], r["host"]) for r in ledger.trials(c.id)]
    assert ("baseline", "lab1") in kinds  # the one baseline
    assert ("trial", "lab2") not in kinds  # cut off mid-bench: not recorded


# --- objectives, the per-load answer, the verdict ---------------------------------------------------


def test_a_latency_objective_keeps_the_throughput_floor(lab: Lab, tmp_path: Path) -> None:
    """minimize p99 ITL with a floor on tok/s: a trial under the floor does not count, and the
    winner has the lowest p99 ITL of those that keep it."""
    path = write_space(
        tmp_path,
        objective={"maximize": None, "minimize": "p99_itl_ms", "at_concurrency": 1, "tok_s_min": 100},
        budget={"restarts": 9},
    )
    outcome = campaign(path, ["lab1", "lab2"], tmp_path).run()
    trials = [t for t in outcome.trials if t.kind == "trial" and t.state in ("complete", "infeasible")]
    assert trials, [(t.label, t.state) for t in outcome.trials]
    for t in trials:
        fast = model_tok_s(t.profile, 1) >= 100 * 1.03
        slow = model_tok_s(t.profile, 1) <= 100 * 0.97
        if fast:
            assert t.state == "complete", t.label
        if slow:
            assert t.state == "infeasible" and "under the floor of 100" in t.diagnosis, t.label
    assert outcome.winner is not None and outcome.winner.state == "complete"
    assert model_tok_s(outcome.winner.profile, 1) >= 100 * 0.97
    c1 = outcome.levels[0][1]
    complete = {t.profile.name for t in trials if t.state == "complete"}
    gain = {r.profile: r.speedup for r in c1 if r.profile in complete}  # p99 ITL, host factors out
    assert gain[outcome.winner.profile.name] == max(gain.values())
    assert outcome.objective == "minimize p99 ITL at c=1 (tok/s of one request at least 100)"
    assert "p99 ITL" in outcome.verdict  # said in the objective's own words


def test_goodput_is_the_most_load_under_the_limits(lab: Lab, tmp_path: Path) -> None:
    """goodput over a concurrency curve: the load at which p99 ITL crosses 14 ms. Plain decode's
    per-token ITL is its round time (11.1 ms at c=1, 13.4 at c=8, 16.1 at c=16 in the stand-in's
    model), so its goodput lies between 8 and 16, where the line crosses 14 ms."""
    path = write_space(
        tmp_path,
        traffic={"concurrency": [1, 4, 8, 16]},
        objective={"maximize": None, "at_concurrency": None, "goodput": {"p99_itl_ms": 14}},
        budget={"restarts": 7},
        search={"confirm": 0},
    )
    c = campaign(path, ["lab1"], tmp_path)
    outcome = c.run()
    assert outcome.objective == "goodput: the most load with p99 ITL under 14 ms"
    itl = {n: 1000 / tunesim.model_tok_s_of(c.x.baseline, n) for n in (8, 16)}  # ms a token
    expected = 8 + 8 * (14 - itl[8]) / (itl[16] - itl[8])
    rows = c.rows()
    fit = c.scores.fit(rows)
    base = c.goal.goodput(c.scores.curve(c.scores.means(rows, "baseline", fit)))
    assert base == pytest.approx(expected, rel=0.1)
    for t in outcome.trials:
        if t.kind == "trial" and t.state == "complete":
            mine = c.goal.goodput(c.scores.curve(c.scores.means(rows, t.profile.name, fit)))
            assert t.value == pytest.approx(mine / base)
    assert outcome.verdict.startswith("over the curve ")
    assert "highest load measured" not in outcome.verdict


def test_goodput_says_when_the_curve_is_too_short_to_tell(lab: Lab, tmp_path: Path) -> None:
    """With a limit the baseline keeps at every level, no trial can show more goodput: the verdict
    says to add load instead of ruling speculation out."""
    path = write_space(
        tmp_path,
        traffic={"concurrency": [1, 4]},
        objective={"maximize": None, "at_concurrency": None, "goodput": {"p99_itl_ms": 400}},
        budget={"restarts": 4},
        search={"confirm": 0},
    )
    outcome = campaign(path, ["lab1"], tmp_path).run()
    assert outcome.verdict.startswith("over the curve the baseline keeps the limits up to the highest load")
    assert not outcome.winner_beats_baseline


def test_every_trial_breaking_the_limits_is_said_so(lab: Lab, tmp_path: Path) -> None:
    path = write_space(tmp_path, objective={"tok_s_min": 100000}, budget={"restarts": 4})
    outcome = campaign(path, ["lab1"], tmp_path).run()
    assert outcome.winner is None
    assert "every one breaks the objective's limits" in outcome.verdict
    assert "under the floor of 100000" in outcome.verdict
    assert "the baseline itself" not in outcome.verdict  # no winner: nothing against it


def test_a_crash_on_one_host_stops_the_others(lab: Lab, tmp_path: Path, monkeypatch) -> None:
    """Anything but Ctrl-C raised on one host (here a bench that crashes) stops every host's next
    trial: the campaign ends with that error, and the ledger says it failed."""
    path = write_space(tmp_path, budget={"restarts": 12})
    c = campaign(path, ["lab1", "lab2"], tmp_path)
    real = lab.run

    def run(target, settings, on_progress, log=None, **kw):
        if target.host == "lab2" and lab.running["lab2"].name != "baseline":
            raise RuntimeError("the bench crashed")
        return real(target, settings, on_progress, log, **kw)

    monkeypatch.setattr(bench, "run", run)
    with pytest.raises(RuntimeError, match="the bench crashed"):
        c.run()
    assert len(lab.deploys) <= 4  # lab1 ends what it does; nothing new starts
    assert ledger.campaign(c.id)["status"] == "failed"


@pytest.mark.parametrize(("budget", "hosts"), [(5, 1), (6, 2), (7, 2), (8, 1)])
def test_the_leaders_never_take_the_adaptive_mode_restart(
    lab: Lab, tmp_path: Path, budget: int, hosts: int
) -> None:
    for name, extends in (("start", "example:cg_5tok"), ("plain", "example:baseline")):
        (tmp_path / f"{name}.yml").write_text(f"extends: {extends}\nserver: {{sglang_version: '0.5.23'}}\n")
    path = write_space(
        tmp_path,
        extends=str(tmp_path / "start.yml"),
        baseline=str(tmp_path / "plain.yml"),
        budget={"restarts": budget},
        search={"seed": 1, "confirm": 2},
    )
    outcome = campaign(path, ["lab1", "lab2"][:hosts], tmp_path).run()
    assert outcome.restarts <= budget
    assert outcome.adaptive is not None and outcome.adaptive.skipped == "", outcome.adaptive


def test_the_outcome_names_the_best_setting_at_each_load(lab: Lab, tmp_path: Path) -> None:
    """Speculation wins at one request and loses at 32 (every request's draft tokens are verified):
    the outcome says where the baseline takes over."""
    path = write_space(tmp_path, traffic={"concurrency": [1, 32]}, budget={"restarts": 8})
    outcome = campaign(path, ["lab1"], tmp_path).run()
    assert [h.setting for h in outcome.per_load][-1] == "the baseline"
    assert outcome.per_load[0].profile == outcome.winner.profile.name
    assert outcome.per_load_line.startswith("no one setting is best at every load: ")
    assert "up to c=1; the baseline from c=32" in outcome.per_load_line


def test_no_speculation_pays_is_said_only_when_the_model_rules_out_the_rest(lab: Lab, tmp_path: Path) -> None:
    """A weak drafter (top-1 acceptance 0.2): nothing beats plain decode. The verdict says so, and
    that the model predicts none of the unmeasured points would; the model's error is reported."""
    lab.accept = 0.2
    path = write_space(tmp_path, budget={"restarts": 7})
    outcome = campaign(path, ["lab1"], tmp_path).run()
    assert not outcome.winner_beats_baseline
    assert "no setting of the space beats the baseline" in outcome.verdict
    assert "the model predicts none of the" in outcome.verdict
    assert outcome.open_points == []
    assert outcome.model is not None and outcome.model.predicted >= 1
    assert outcome.model.error is not None and outcome.model.error < 0.1
    assert outcome.left == "baseline"  # --leave best leaves the baseline where nothing beats it


def test_sglang_adaptive_mode_is_measured_with_the_campaign_own_tiers(lab: Lab, tmp_path: Path) -> None:
    """On SGLang 0.5.23 a campaign also measures --speculative-adaptive, its tiers the steps of each
    level's best static setting (0 where the baseline wins), and puts it against that setting."""
    for name, extends in (("start", "example:cg_5tok"), ("plain", "example:baseline")):
        (tmp_path / f"{name}.yml").write_text(f"extends: {extends}\nserver: {{sglang_version: '0.5.23'}}\n")
    path = write_space(
        tmp_path,
        {
            "speculative.num_steps": [1, 3, 5],
            "speculative.eagle_topk": [1],
            "speculative.num_draft_tokens": [2, 4, 6],
        },
        extends=str(tmp_path / "start.yml"),
        baseline=str(tmp_path / "plain.yml"),
        traffic={"concurrency": [1, 32]},
        budget={"restarts": 6},
    )
    x = space.expand(path)
    assert len(x.valid) == 3 and tune.adaptive_why_not(x) == ""
    outcome = campaign(path, ["lab1"], tmp_path).run()
    assert outcome.restarts <= 6
    report = outcome.adaptive
    assert report is not None and not report.skipped, report
    winner_steps = outcome.winner.profile.speculative.num_steps
    # speculation loses at a batch of 32; batches from 6 (the geometric midpoint of 1 and 32) on
    # take that level's tier
    assert report.tiers == {1: [winner_steps], 6: [0]}
    measured = [t for t in outcome.trials if t.kind == "adaptive"]
    assert len(measured) == 1 and measured[0].restarted and measured[0].state == "complete"
    assert measured[0].profile.speculative.adaptive.tiers == report.tiers
    loads = {load: (best, ratio) for load, best, _, ratio in report.levels}
    assert loads["c=1"][0] == outcome.winner.label and loads["c=32"][0] == "the baseline"
    assert all(
        ratio == pytest.approx(1.0, abs=0.05) for _, ratio in loads.values()
    )  # each tier runs as its winner
    assert report.line().startswith("adaptive mode (tiers {1: [")


def test_adaptive_mode_is_skipped_with_the_reason(lab: Lab, tmp_path: Path) -> None:
    x = space.expand(write_space(tmp_path))
    assert tune.adaptive_why_not(x) == "SGLang 0.5.9 has no --speculative-adaptive (0.5.23 has)"


def test_restarts_asked_together_share_one_play() -> None:
    """Hosts choosing their next point are waited for; a host that will not restart is not; an
    error of the play reaches every host in it."""
    plays: list[list[str]] = []

    def play(assign: dict) -> dict[str, str]:
        plays.append(sorted(assign))
        if "bad" in assign.values():
            raise RuntimeError("the play broke")
        return {h: "" for h in assign}

    gather = tune._Gather(play)
    gather.expect(["lab1", "lab2", "lab3"])
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(gather.restart, "lab1", "p1")
        second = pool.submit(gather.restart, "lab2", "p2")
        gather.done("lab3")  # lab3 benches on: the play does not wait for it
        assert first.result(timeout=5) == second.result(timeout=5) == {"lab1": "", "lab2": ""}
    assert plays == [["lab1", "lab2"]]
    gather.expect(["lab1", "lab2"])
    with ThreadPoolExecutor(2) as pool:
        failed = [pool.submit(gather.restart, h, "bad") for h in ("lab1", "lab2")]
        for f in failed:
            with pytest.raises(RuntimeError, match="the play broke"):
                f.result(timeout=5)
    assert plays[-1] == ["lab1", "lab2"]


def test_each_trial_reads_the_journal_once_and_each_run_takes_its_own_window(
    lab: Lab, tmp_path: Path
) -> None:
    """A read is a play (an ansible-playbook process): one per trial, not one per bench run. Each
    run's accept length is from the log lines of its own window, as a read after it would give."""
    path = write_space(tmp_path, budget={"restarts": 5})
    c = campaign(path, ["lab1"], tmp_path)
    c.run()
    benched = [t for t in c.trials if t.state in ("complete", "stopped", "infeasible")]
    assert len(lab.reads) == sum(1 for t in benched if t.kind != "baseline")  # the baseline logs none
    rows = [r for r in ledger.bench_results() if r["sweep_id"] == c.id and r["speculative"]]
    assert rows and all(r["accept_len_log"] == pytest.approx(r["accept_len"], abs=0.01) for r in rows)
    assert len({r["accept_len_log"] for r in rows}) > 1  # runs of other points: other lines


def test_a_run_takes_the_log_lines_of_its_own_window() -> None:
    target = bench.Target("lab1", "a", 1, "p")
    runs = [bench.BenchResult(target, bench.Settings(), [], 1.0, speculative=True) for _ in range(2)]
    (runs[0].began_epoch, runs[0].ended_epoch), (runs[1].began_epoch, runs[1].ended_epoch) = (
        (10, 20),
        (30, 40),
    )
    lines = [(15.0, "accept len: 2.00"), (25.0, "accept len: 9.00"), (35.0, "accept len: 3.00")]
    for r in runs:
        bench.logged(r, lines)
    assert [r.accept_len_log for r in runs] == [2.0, 3.0]
