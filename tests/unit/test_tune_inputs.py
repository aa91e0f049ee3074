"""What is accepted is what runs, on tune's surfaces: what can fail at a campaign's end is checked
at its start, and what still fails there is reported after the outcome, never instead of it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from test_tune import campaign, write_space
from test_tune import lab as lab
from tunesim import Lab

from orchestrator.cli.main import cli
from orchestrator.errors import InputError, Interrupted
from orchestrator.profile import model as profile_mod
from orchestrator.tuning import bench as _bench

#: the real journal reader (the lab fixture replaces it)
JOURNAL_LINES = _bench.journal_lines


def stopped(lab: Lab, path: Path, tmp_path: Path) -> Any:
    """A campaign on lab1 stopped by Ctrl-C in its fourth deploy: the baseline and two trials in."""
    first = campaign(path, ["lab1"], tmp_path)
    lab.interrupt_at = 4
    with pytest.raises(Interrupted):
        first.run()
    lab.interrupt_at = None
    return first


def run_tune(tmp_path: Path, *extra: str, budget: int = 4, env: dict[str, str] | None = None) -> Any:
    path = write_space(tmp_path, budget={"restarts": budget})
    (tmp_path / "inv.yml").write_text("all:\n  hosts:\n    lab1: {}\n")
    (tmp_path / "profiles").mkdir(exist_ok=True)
    argv = ["--profiles-dir", str(tmp_path / "profiles"), "tune", str(path), "-i", str(tmp_path / "inv.yml")]
    return CliRunner().invoke(cli, [*argv, *extra], env=env)


def test_plot_without_matplotlib_is_refused_before_any_restart(lab: Lab, tmp_path: Path, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a))
    done = run_tune(tmp_path, "--plot", str(tmp_path / "x.png"))
    assert done.exit_code != 0 and "--plot draws with matplotlib, which is not installed" in done.output
    assert lab.deploys == []


def test_plot_naming_a_fifo_or_an_unknown_format_is_refused_before_any_restart(
    lab: Lab, tmp_path: Path
) -> None:
    fifo = tmp_path / "plot.png"
    os.mkfifo(fifo)
    done = run_tune(tmp_path, "--plot", str(fifo))
    assert done.exit_code != 0 and "not a regular file" in done.output
    done = run_tune(tmp_path, "--plot", str(tmp_path / "plot.jpg"))
    assert done.exit_code != 0 and "name a .png, .svg, .pdf file" in done.output
    assert lab.deploys == []


def test_plot_out_svg_writes_svg_and_a_failed_plot_comes_after_the_outcome(
    lab: Lab, tmp_path: Path, monkeypatch
) -> None:
    svg = tmp_path / "out.svg"
    done = run_tune(tmp_path, "--plot", str(svg))
    assert done.exit_code == 0, done.output
    assert b"<svg" in svg.read_bytes()[:400]

    from orchestrator.tuning import plot as plot_mod

    def broken(*args: Any, **kw: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plot_mod, "plot_curves", broken)
    done = (
        run_tune(tmp_path / "again", "--plot", str(tmp_path / "again.png"))
        if (tmp_path / "again").mkdir() is None
        else None
    )
    assert done is not None and done.exit_code == 1
    assert "verdict:" in done.output and "winner written:" in done.output  # the outcome first
    assert "not drawn: No space left on device" in done.output


def test_a_profiles_folder_that_is_a_file_is_refused_before_any_restart(lab: Lab, tmp_path: Path) -> None:
    path = write_space(tmp_path, budget={"restarts": 4})
    (tmp_path / "afile").write_text("")
    c = campaign(path, ["lab1"], tmp_path)
    c.options.profiles_dir = tmp_path / "afile"
    with pytest.raises(InputError, match="is not a folder"):
        c.run()
    assert lab.deploys == []


def test_the_winner_extends_its_parent_from_a_linked_profiles_folder(lab: Lab, tmp_path: Path) -> None:
    """`./profiles` a link to a folder elsewhere: the winner's `extends:` is written from where the
    file really lies, so that it loads."""
    parent = tmp_path / "mine" / "parent.yml"
    parent.parent.mkdir()
    parent.write_text("extends: example:cg_5tok\n")
    real = tmp_path / "real" / "deep" / "profiles"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    path = write_space(tmp_path, budget={"restarts": 4})
    data = yaml.safe_load(path.read_text())
    data["extends"] = str(Path("mine") / "parent.yml")
    path.write_text(yaml.safe_dump(data))
    c = campaign(path, ["lab1"], tmp_path)
    c.options.profiles_dir = tmp_path / "link"
    outcome = c.run()
    assert outcome.winner_file and not outcome.winner_error
    assert profile_mod.load(outcome.winner_file).name  # it loads: its parent is found


def test_resume_refuses_a_trial_whose_unit_changed_since(lab: Lab, tmp_path: Path) -> None:
    """The space's parent profile changes between Ctrl-C and --resume: its old runs would be scored
    as the new points. Resume compares each trial's rendered unit with the one it ran."""
    parent = tmp_path / "parent.yml"
    parent.write_text("extends: example:cg_5tok\n")
    path = write_space(tmp_path, budget={"restarts": 8})
    data = yaml.safe_load(path.read_text())
    data["extends"] = str(parent)
    path.write_text(yaml.safe_dump(data))
    first = stopped(lab, path, tmp_path)
    parent.write_text("extends: example:cg_5tok\nenv:\n  MY_FLAG: '1'\n")
    with pytest.raises(
        InputError, match=f"campaign {first.id}: .* ran a unit of digest .*put the old files back"
    ):
        campaign(path, [], tmp_path, resume=first.id).run()
    parent.write_text("extends: example:cg_5tok\n")  # put back: it resumes
    assert campaign(path, [], tmp_path, resume=first.id).run().winner is not None


def test_leave_none_after_resume_says_where_the_baseline_was_put(lab: Lab, tmp_path: Path) -> None:
    """Ctrl-C while leaving the hosts: the search is done. A resume with --leave none measures
    nothing more; what runs on the host is not known, so it says the baseline goes there."""
    path = write_space(tmp_path, budget={"restarts": 4})
    first = campaign(path, ["lab1"], tmp_path)
    lab.interrupt_leave = True
    with pytest.raises(Interrupted, match="while leaving"):
        first.run()
    lab.interrupt_leave = False
    lab.deploys.clear()
    outcome = campaign(path, [], tmp_path, resume=first.id, leave="none").run()
    assert len(lab.deploys) == 1  # the leave only
    assert outcome.left == "as it was (--leave none); the baseline on lab1, whose unit was not known"


HAND_EDITS = [
    ("UPDATE campaigns SET hosts='h1,h2' WHERE id=?", "hosts"),
    ("UPDATE campaigns SET hosts='[]' WHERE id=?", "hosts"),
    ("UPDATE campaigns SET hosts='null' WHERE id=?", "hosts"),
    ("UPDATE trials SET point='7' WHERE campaign_id=? AND kind='trial'", "point"),
    (
        "UPDATE trials SET point='{\"speculative.num_steps\": [1]}' WHERE campaign_id=? AND kind='trial'",
        "point",
    ),
    ("UPDATE trials SET kind='guess' WHERE campaign_id=? AND kind='trial'", "kind"),
    ("UPDATE bench_results SET tok_s=0 WHERE sweep_id=? AND profile='baseline'", "state"),
]


@pytest.mark.parametrize(("edit", "column"), HAND_EDITS)
def test_hand_edited_campaign_rows_never_crash_resume(
    lab: Lab, tmp_path: Path, edit: str, column: str
) -> None:
    """A row edited by hand is skipped with a note naming it, or refused with an error naming the
    column; never a traceback."""
    import sqlite3

    from orchestrator import ledger

    path = write_space(tmp_path, budget={"restarts": 8})
    first = stopped(lab, path, tmp_path)
    with sqlite3.connect(ledger.path()) as conn:
        conn.execute(edit, (first.id,))
    ledger.take_unreadable()
    try:
        outcome = campaign(path, [], tmp_path, resume=first.id).run()
    except InputError as exc:
        assert column in str(exc)
    else:
        notes = " ".join(ledger.take_unreadable())
        assert "row id" in notes and f"{column} holds" in notes, notes  # skipped, and said
        assert outcome.winner is not None  # the campaign went on: the point is measured anew


# --- --check says what the run does ------------------------------------------------------------


def check(tmp_path: Path, path: Path, *extra: str) -> Any:
    (tmp_path / "inv.yml").write_text("all:\n  hosts:\n    lab1: {}\n    lab2: {}\n")
    return CliRunner().invoke(cli, ["tune", str(path), "-i", str(tmp_path / "inv.yml"), "--check", *extra])


def test_check_refuses_the_budget_the_run_refuses(lab: Lab, tmp_path: Path) -> None:
    done = check(tmp_path, write_space(tmp_path, budget={"restarts": 1}))
    assert done.exit_code != 0
    assert "budget.restarts 1 measures no point" in " ".join(done.output.split())


def test_check_json_prints_one_strict_json_object(lab: Lab, tmp_path: Path) -> None:
    import json

    done = check(tmp_path, write_space(tmp_path), "--json")
    assert done.exit_code == 0, done.output
    said = json.loads(done.stdout, parse_constant=lambda c: pytest.fail(f"not JSON: {c}"))
    assert said["trials"] and said["estimate"]["wall_s"] > 0 and said["hosts"] == ["lab1", "lab2"]
    assert said["budget_problem"] is None


def test_the_estimate_counts_open_loop_arrivals_and_skips_negative_durations(
    lab: Lab, tmp_path: Path
) -> None:
    """0.05 requests/s for 100 requests: the arrivals alone take 2,000 s a run. A hand-edited
    negative duration in the ledger never makes a negative estimate."""
    from orchestrator import ledger
    from orchestrator.tuning import space, tune

    path = write_space(
        tmp_path,
        traffic={"concurrency": [1], "request_rate": [0.05], "requests": 100},
        objective={"maximize": "tok_s", "at_concurrency": None, "at_request_rate": 0.05},
    )
    est = tune.estimate(space.expand(path), 1)
    assert est.bench_s >= 2 * 2000  # repeat 2
    row = {"run_id": "r", "host": "lab1", "profile": "x", "result": "ok", "tok_s": 5.0, "requests": 100}
    ledger.record_bench(row | {"duration_s": -14386.0, "concurrency": 1, "request_rate": 0.05})
    assert tune.estimate(space.expand(path), 1).wall_s > 0


# --- one setting, one trial --------------------------------------------------------------------


def test_values_that_render_one_unit_are_one_trial(tmp_path: Path) -> None:
    from orchestrator.tuning import space

    path = write_space(tmp_path, {"server.mem_fraction_static": [0.5]})
    path.write_text(path.read_text().replace("- 0.5", "[.5, 0.50, 5e-1, 0.6]").replace(":\n  [", ": ["))
    x = space.expand(path)
    assert len(x.valid) == 2, [p.label for p in x.points]
    assert [p.pruned.split(":")[0] for p in x.pruned] == ["the same unit as mem_fraction_static=.5"] * 2


def test_a_concurrency_given_twice_is_refused(tmp_path: Path) -> None:
    from orchestrator.tuning import space

    path = write_space(tmp_path, traffic={"concurrency": [8, 8]})
    with pytest.raises(InputError, match="concurrency gives 8 more than once: give each level once"):
        space.expand(path)


# --- found by a hostile review of the above ----------------------------------------------------


def test_ctrl_c_while_a_play_gathers_starts_no_play() -> None:
    from orchestrator.tuning import tune

    plays: list[Any] = []
    stop = [False]
    gather = tune._Gather(lambda assign: plays.append(assign) or {}, lambda: stop[0])
    gather.expect(["lab1", "lab2"])
    stop[0] = True  # Ctrl-C lands while lab1 waits for lab2
    with pytest.raises(tune._Stop):
        gather.restart("lab1", "p")
    assert plays == []


def test_leave_none_restarts_no_host_the_campaign_never_used(lab: Lab, tmp_path: Path) -> None:
    path = write_space(
        tmp_path, {"speculative.num_steps": [3]}, budget={"restarts": 2}, search={"confirm": 0}
    )
    outcome = campaign(path, ["lab1", "lab2", "lab3"], tmp_path, leave="none").run()
    used = {t.host for t in outcome.trials}
    assert used and "lab3" not in used
    assert all("lab3" not in d for d in lab.deploys)  # not even the end's leave play


def test_resume_refuses_runs_of_another_dataset(lab: Lab, tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("Write a haiku about GPUs.\nExplain a mutex in one line.\n")
    path = write_space(tmp_path, budget={"restarts": 8}, traffic={"dataset": str(prompts)})
    first = stopped(lab, path, tmp_path)
    prompts.write_text("Something else entirely.\n")
    with pytest.raises(InputError, match=r"was measured with other traffic .*put the old dataset back"):
        campaign(path, [], tmp_path, resume=first.id).run()


def test_a_baseline_with_other_secrets_than_the_trials_is_refused_at_expand(
    tmp_path: Path, monkeypatch
) -> None:
    """The baseline and the trials share plays, and one play carries one set of secrets."""
    from orchestrator.tuning import space

    monkeypatch.setenv("MYKEY", "k" * 20)
    keyed = tmp_path / "keyed.yml"
    keyed.write_text("extends: example:baseline\napi_key: {env: MYKEY}\n")
    path = write_space(tmp_path, baseline=str(keyed))
    with pytest.raises(
        InputError, match=r"baseline .*'s api_key is not .*: the baseline and the trials share"
    ):
        space.expand(path)


def test_a_journal_that_cannot_be_read_is_named_in_each_runs_notes(
    lab: Lab, tmp_path: Path, monkeypatch
) -> None:
    """The logs play answers a host's failure (a task result over ansible-runner's limit) instead of
    lines: each run says the log was not read, and why, never 'no accept len line'."""
    from orchestrator import ledger
    from orchestrator.hosts import logs_play
    from orchestrator.tuning import bench

    failed = logs_play.HostFailure("lab1", "task result over MAX_EVENT_RES", False)
    batch = logs_play.LogBatch(["lab1"], [], failures=[failed])
    monkeypatch.setattr(bench, "journal_lines", JOURNAL_LINES)  # the real reader, over a failed play
    monkeypatch.setattr(logs_play, "read", lambda *a, **kw: batch)
    c = campaign(write_space(tmp_path, budget={"restarts": 4}), ["lab1"], tmp_path)
    c.run()
    spec = [r for r in ledger.bench_results() if r["sweep_id"] == c.id and r["speculative"]]
    said = "the server log was not read: task result over MAX_EVENT_RES"
    assert spec and all(said in r["notes"] for r in spec)
    assert not any("no `accept len` line" in r["notes"] for r in spec)


def test_check_refuses_a_resume_of_no_campaign(lab: Lab, tmp_path: Path) -> None:
    done = check(tmp_path, write_space(tmp_path), "--resume", "nosuchid")
    assert done.exit_code != 0 and "--resume nosuchid: no such campaign in the ledger" in done.output
