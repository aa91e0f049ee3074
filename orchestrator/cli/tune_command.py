"""`tune`: a tuning campaign from a search space file.

The engine is tune.py. The file is read by space.py.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator import ledger
from orchestrator.cli.console import (
    check_plot_folder,
    err,
    handle_errors,
    inventory_option,
    inventory_or_lab,
    limit_option,
    out,
    plain,
    shown,
)
from orchestrator.errors import InputError, OrchestratorError
from orchestrator.tuning import space as space_mod
from orchestrator.tuning import stats
from orchestrator.tuning import tune as tune_mod


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _interval(i: stats.Interval | None) -> str:
    if i is None:
        return "-"
    if i.low is None or i.high is None:
        return f"{i.mean:.1f} (1 run)"
    return f"{i.mean:.1f} ({i.low:.1f}..{i.high:.1f})"


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _points(x: space_mod.Expanded, trials: int) -> str:
    """How many points a campaign measures: one more where the leaders' kept restart goes back to
    the search (both leaders still run somewhere, so their extra runs need none)."""
    more = tune_mod.confirm_reserve(x.space) and trials < len(x.valid)
    return f"{trials} or {trials + 1} points" if more else f"{trials} points"


def check_json(x: space_mod.Expanded, hosts: list[str]) -> dict[str, Any]:
    """`--check --json`: what --check prints, as one object."""
    est = tune_mod.estimate(x, len(hosts))
    level, goal = x.level(), tune_mod.goal_of(x)
    return {
        "space": str(x.path),
        "hosts": hosts,
        "trials": [{"profile": p.name, "point": p.params} for p in x.valid],
        "pruned": [{"point": p.params, "reason": p.pruned} for p in x.pruned],
        "objective": goal.describe(level.level),
        "baseline": x.baseline.name,
        "budget": x.space.budget.restarts,
        "budget_problem": tune_mod.budget_problem(x) or None,
        "search": x.space.search.sampler,
        "adaptive": tune_mod.adaptive_why_not(x) or "measured",
        "estimate": dataclasses.asdict(est),
    }


def check_output(x: space_mod.Expanded, hosts: list[str]) -> None:
    """`--check`: the trials, the pruned points with their reasons, and a time estimate."""
    est = tune_mod.estimate(x, len(hosts))
    table = Table(
        title=shown(f"{x.path}: {len(x.valid)} trials, {len(x.pruned)} pruned of {len(x.points)} points")
    )
    for col in ("trial profile", "point"):
        table.add_column(col)
    for p in x.valid:
        table.add_row(shown(p.name), shown(p.label))
    out.print(table)
    for p in x.pruned:
        out.print(Text.assemble(("pruned ", "yellow"), shown(p.label), ": ", shown(p.pruned)))
    level, goal = x.level(), tune_mod.goal_of(x)
    out.print(f"objective: {goal.describe(level.level)}, against {shown(x.baseline.name)}")
    out.print(
        f"budget: {x.space.budget.restarts} restarts (the exhaustive grid is {len(x.valid)} trials + "
        f"the baseline); on {len(hosts)} host(s): {', '.join(shown(h) for h in hosts)}"
    )
    out.print(
        f"search: {x.space.search.sampler}; {_points(x, est.trials)} measured, one baseline on the first "
        "host free (each host's speed is fitted from the trials)"
    )
    why = tune_mod.adaptive_why_not(x)
    out.print(
        "adaptive mode: measured once, with tiers of the per-level winners (one restart)"
        if not why
        else f"adaptive mode: not measured: {why}"
    )
    out.print(
        f"estimate: {est.restarts} restarts in {est.rounds} rounds, about {_duration(est.wall_s)} "
        f"({est.basis})"
    )
    out.print("nothing was changed (--check)")
    problem = tune_mod.budget_problem(x)
    if problem:  # the run refuses it: --check says so the same way
        raise InputError(problem)


def _trial_line(t: tune_mod.Trial) -> Text:
    style = {"complete": "green", "stopped": "yellow", "failed": "red", "infeasible": "yellow"}.get(
        t.state, ""
    )
    value = f" {t.value:.3f}x" if t.value is not None else ""
    why = f": {t.diagnosis}" if t.diagnosis else ""
    cost = f" (restart: {t.startup})" if t.startup else ""
    return Text.assemble(
        (time.strftime("%H:%M:%S"), "dim"),
        f" {shown(t.host)} {t.kind} {shown(t.label)} ",
        (t.state, style),
        shown(value + why + cost),
    )


def _status_view(s: tune_mod.Status) -> Table:
    grid = Table.grid(padding=(0, 1))
    best = f"best {shown(s.best)} {s.best_value:.3f}x" if s.best and s.best_value else "best: -"
    left = f", about {_duration(s.eta_s)} left" if s.eta_s is not None else ""
    grid.add_row(
        Text(
            f"tune {s.campaign_id} {s.phase}: restarts {s.restarts_used}/{s.budget}, "
            f"trials {s.trials_done}, {best}{left}"
        )
    )
    for host, what in sorted(s.running.items()):
        grid.add_row(Text(f"  {shown(host)}: {shown(what)}", style="dim"))
    return grid


@contextmanager
def _live() -> Iterator[tuple[Any, Any]]:
    live = Live(console=err, transient=True, refresh_per_second=4)

    def on_status(s: tune_mod.Status) -> None:
        live.update(_status_view(s))

    def on_trial(t: tune_mod.Trial) -> None:
        live.console.print(_trial_line(t))

    with live:
        yield on_status, on_trial


def level_tables(outcome: tune_mod.Outcome) -> list[Table]:
    tables = []
    for level, rows in outcome.levels:
        table = Table(title=shown(level.label()))
        cols = ("setting", "profile", "tok/s (95% interval)", "gain", "accept", "p99 TTFT", "p99 ITL")
        for col in cols:
            table.add_column(col, justify="right" if col not in ("setting", "profile") else "left")
        for r in rows:
            ttft = "-" if r.p99_ttft_ms is None else f"{r.p99_ttft_ms:.0f} ms"
            itl = "-" if r.p99_itl_ms is None else f"{r.p99_itl_ms:.1f} ms"
            accept = "-" if r.accept_len is None else f"{r.accept_len:.2f}"
            table.add_row(
                shown(r.label), shown(r.profile), _interval(r.tok_s), _pct(r.speedup), accept, ttft, itl
            )
        tables.append(table)
    return tables


def outcome_json(o: tune_mod.Outcome) -> dict[str, Any]:
    def level_row(r: tune_mod.LevelBest) -> dict[str, Any]:
        i = r.tok_s
        return {
            "profile": r.profile,
            "setting": r.label,
            "tok_s": i.mean if i else None,
            "tok_s_low": i.low if i else None,
            "tok_s_high": i.high if i else None,
            "speedup": r.speedup,
            "accept_len": r.accept_len,
            "p99_ttft_ms": r.p99_ttft_ms,
            "p99_itl_ms": r.p99_itl_ms,
            "total_tok_s": r.total_tok_s,
        }

    model = o.model

    return {
        "campaign_id": o.campaign_id,
        "space": o.space,
        "hosts": o.hosts,
        "restarts": o.restarts,
        "grid": o.grid,
        "wall_s": o.wall_s,
        "verdict": o.verdict,
        "leaders": o.leaders,
        "winner": o.winner.profile.name if o.winner else None,
        "winner_setting": o.winner.params if o.winner else None,
        "winner_beats_baseline": o.winner_beats_baseline,
        "winner_file": o.winner_file,
        "winner_error": o.winner_error,
        "levels": [
            {"level": level.label(), "rows": [level_row(r) for r in rows]} for level, rows in o.levels
        ],
        "trials": [t.row(o.campaign_id) for t in o.trials],
        "pruned": [{"point": p.params, "reason": p.pruned} for p in o.pruned],
        "left": o.left,
        "left_ok": o.left_ok,
        "left_message": o.left_message,
        "method": stats.METHOD,
        "objective": o.objective,
        "per_load": [{"setting": h.setting, "profile": h.profile, "levels": h.levels} for h in o.per_load],
        "per_load_line": o.per_load_line,
        "open_points": o.open_points,
        "adaptive": None
        if o.adaptive is None
        else {
            "tiers": o.adaptive.tiers,
            "profile": o.adaptive.profile,
            "skipped": o.adaptive.skipped,
            "levels": [
                {"load": load, "best_static": best, "verdict": verdict, "ratio": ratio}
                for load, best, verdict, ratio in o.adaptive.levels
            ],
            "line": o.adaptive.line(),
        },
        "model": None
        if model is None
        else {
            "error": model.error,
            "predicted_trials": model.predicted,
            "host_factors": model.hosts,
            "accept": model.accept,
        },
    }


@click.command()
@click.argument(
    "space_file", metavar="SPACE.yml", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@inventory_option("the local lab, brought up if needed")
@limit_option("Hosts to run trials on: one trial per host at a time (default: every host).")
@click.option(
    "--check", is_flag=True, help="List the trials, the pruned points and a time estimate; change nothing."
)
@click.option(
    "--resume", metavar="ID", help="Go on with this campaign (after Ctrl-C, a crash, a lost session)."
)
@click.option(
    "--leave",
    type=click.Choice(["best", "baseline", "none"]),
    default="best",
    show_default=True,
    help="What runs on the hosts at the end: the winner where it beats the baseline (else the "
    "baseline), the baseline, or the last trial.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Draw tok/s against load for the baseline and the best trials (.png, .svg or .pdf; needs "
    "matplotlib).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as one JSON object.")
@handle_errors
def tune(
    space_file: Path,
    inventory: Path | None,
    limit: str | None,
    check: bool,
    resume: str | None,
    leave: str,
    plot: Path | None,
    as_json: bool,
) -> None:
    """Search SPACE.yml's settings for the best on its traffic, with far fewer restarts than the grid.

    Every point of the space becomes a profile checked by every rule (a refused point is pruned,
    with the rule's reason). A model of speculative decoding, fitted to what each trial measured,
    picks the next; each trial is a deploy and a bench of the space's traffic, and each host takes
    the next as it finishes. The baseline is measured once; the model puts every host on its
    scale. The winner is written as a new profile file; the outcome names the best per load.
    """
    from orchestrator.hosts import inventory as inventory_mod

    if resume is not None and not resume.strip():
        raise InputError("--resume '': give the campaign's id (`history` and `results` show it)")
    x = _expanded(space_file)
    inv = inventory_or_lab(inventory)
    hosts = [h.name for h in inventory_mod.selected(inv, limit)]
    if check and resume is not None and ledger.campaign(resume) is None:  # the run refuses it too
        raise InputError(
            f"--resume {resume}: no such campaign in the ledger: check the id (`history` shows it)"
        )
    if check and as_json:
        click.echo(json.dumps(check_json(x, hosts), indent=2))
        problem = tune_mod.budget_problem(x)
        if problem:
            raise InputError(problem)
        return
    if check:
        check_output(x, hosts)
        return
    if plot is not None:
        check_plot_folder(plot)
    with _live() as (on_status, on_trial):
        campaign = tune_mod.Campaign(
            x,
            inv,
            hosts if limit or not resume else [],
            tune_mod.Options(leave=leave, on_status=on_status, on_trial=on_trial),
            resume=resume,
        )
        outcome = campaign.run()
    if as_json:
        click.echo(json.dumps(outcome_json(outcome), indent=2))
    else:
        _print(outcome)
    drawn = True
    if plot is not None:  # after the outcome: what fails here never hides it
        try:
            _plot(campaign, outcome, plot)
        except (OrchestratorError, OSError) as exc:
            drawn = False
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            err.print(plain(f"--plot {shown(plot)}: not drawn: {why}", "red"))
    ok = outcome.left_ok and outcome.winner is not None and not outcome.winner_error and drawn
    sys.exit(0 if ok else 1)


def _expanded(path: Path) -> space_mod.Expanded:
    """The space expanded, with a progress bar on stderr: each point's unit is read by
    systemd-analyze, so a large space takes a while."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn("checking the space's points"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("points", total=None)

        def on_point(total: int) -> None:
            progress.update(task, total=total, advance=1)

        return space_mod.expand(path, on_point=on_point)


def _print(o: tune_mod.Outcome) -> None:
    for table in level_tables(o):
        out.print(table)
    done = [t for t in o.trials if t.kind == "trial"]
    states = {
        s: sum(1 for t in done if t.state == s) for s in ("complete", "stopped", "failed", "infeasible")
    }
    counts = ", ".join(f"{n} {s}" for s, n in states.items() if n)
    out.print(
        f"campaign {o.campaign_id}: {len(done)} trials ({counts}), "
        f"{o.restarts} restarts against {o.grid} for the grid, {len(o.pruned)} points pruned, "
        f"{len(o.hosts)} host(s), {_duration(o.wall_s)}"
    )
    for t in o.failures:
        err.print(plain(f"failed: {t.label} on {t.host}: {t.diagnosis}", "red"))
    if o.leaders == "tie":
        out.print("leaders: the two best are within noise of each other (a tie); either will do")
    if o.model is not None and o.model.error is not None:
        hosts = ", ".join(f"{shown(h)} {f:.3f}" for h, f in sorted(o.model.hosts.items()))
        out.print(
            f"model: predicted the {o.model.predicted} trial(s) it chose within {o.model.error:.1%} on "
            f"average (before they ran); host speed factors: {hosts}"
        )
    if o.per_load_line:
        out.print(shown(o.per_load_line))
    if o.adaptive is not None:
        out.print(shown(o.adaptive.line()))
    out.print(Text(shown(f"verdict: {o.verdict}"), style="bold"))
    if o.winner_file:
        out.print(f"winner written: {shown(o.winner_file)}  (deploy it with -p {shown(o.winner_file)})")
    if o.winner_error:
        err.print(plain(o.winner_error, "red"))
    if o.left_ok:
        out.print(f"left deployed: {shown(o.left)}")
    else:
        err.print(plain(f"not left deployed: {o.left}: {o.left_message}", "red"))


def _plot(campaign: tune_mod.Campaign, o: tune_mod.Outcome, path: Path) -> None:
    from orchestrator.tuning import plot as plot_mod
    from orchestrator.tuning import sweep as sweep_mod

    names = {campaign.baseline.name} | {r.profile for _, rows in o.levels for r in rows[:3]}
    rows = [r for r in campaign.rows() if r["profile"] in names]
    plot_mod.plot_curves(
        sweep_mod.curves(rows, campaign.baseline.name), campaign.baseline.name, path, f"tune {o.campaign_id}"
    )
    err.print(f"plot: {shown(path)}")
