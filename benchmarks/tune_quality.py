"""How well `tune` searches, printed as numbers (never asserted).

On the lab (the default), for each drafter (the stand-in's accept_top1: 0.44, the default; 0.3, a
weak one; 0.7, a strong one; set with SGLANG_STANDIN_ACCEPT_TOP1 in every profile):

- the exhaustive grid once, as SGLang's bench_speculative.py would run it: every valid point of
  a 4 x 3 x 5 space (29 of 60 pass the profile rules), code prompts at c=1 and c=8, no early
  stop. Its best point at each level is that level's reference winner. The grid measures one
  baseline; every run is put on its scale with the host factors the campaign's own fit reports;
- for each level (the objective: tok/s at c=1, at c=8), `tune` with N noise seeds from the valid
  point farthest from the reference winner, with at most a quarter of the grid's restarts (7 of
  30). A winner counts as found when it is the reference, within 1.5% of it (one run's noise) in
  the grid's runs, or within noise of it by Welch's test over them. Printed: found, the restarts
  each seed used, the model's error on the points it predicted before measuring them;
- the same campaign on 1 host and on 4 hosts, with the same budget: the wall times; and a
  restarting deploy onto 4 hosts in one play against one onto 1 host, which bounds what 4 hosts
  can gain on this machine (the lab's hosts share its cores).

Goals (the tune issue's): the reference winner, or one within noise, in at least 9 of 10 runs, with
at most 1/4 of the grid's restarts; 4 hosts in at most 0.4x the wall time of 1.

The stand-in's noise is on (1.5% a run, host factors in [0.96, 1.0]); each campaign's profiles set
SGLANG_STANDIN_NOISE_SEED to its seed, so each run draws another series.

Usage: python3 benchmarks/tune_quality.py [--seeds 10] [--hosts 4] [--accept X]... [--level N]...
       [--skip-hosts] [--only-hosts] [--simulate]
Needs the lab (four hosts; brought up if it is not). Takes about an hour on a 2-core machine.

`--simulate` needs no lab. It runs the same search in memory (tests/unit/tunesim.py: the stand-in's
speed model, 1.5% run noise, four host factors) over three drafters (top-1 acceptance 0.44, 0.3,
0.7) and two objectives (tok/s at c=1 and at c=8). For each: the exact grid once (the reference
winner), then `--seeds` campaigns from the valid point farthest from the winner, with at most a
quarter of the grid's restarts (7 of 30). A winner within 1.5% (one run's noise) of the reference
counts as found.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.paths import ROOT, state_dir
from orchestrator.tuning import stats

HOSTS = ["lab1", "lab2", "lab3", "lab4"]
GRID = """\
  speculative.num_steps: [1, 2, 3, 5]
  speculative.eagle_topk: [1, 2, 4]
  speculative.num_draft_tokens: [2, 4, 5, 8, 16]
"""
TRAFFIC = f"""\
traffic:
  endpoint: chat
  dataset: {ROOT / "tests/data/datasets/code.jsonl"}
  concurrency: [1, 8]
  requests: 8
  max_tokens: 32
  warmup: 1
  repeat: 2
objective: {{maximize: tok_s, at_concurrency: 1}}
"""


def profiles(folder: Path, seed: int, accept: float | None = None) -> None:
    """The example profiles, each with this run's noise seed (and the drafter's accept_top1)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yml").write_text((ROOT / "profiles/base.yml").read_text())
    env = f"env:\n  SGLANG_STANDIN_NOISE_SEED: '{seed}'\n"
    if accept is not None:
        env += f"  SGLANG_STANDIN_ACCEPT_TOP1: '{accept}'\n"
    for name in ("cg_5tok", "baseline", "eagle3_16tok_nocg", "cg_16tok"):
        text = (ROOT / f"profiles/{name}.yml").read_text()
        (folder / f"{name}.yml").write_text(text + env)


def space(folder: Path, search: str, budget: int, extends: str = "cg_5tok", level: int = 1) -> Path:
    path = folder / "space.yml"
    head = f"extends: {extends}\nbaseline: baseline\nvary:\n"
    traffic = TRAFFIC.replace("at_concurrency: 1", f"at_concurrency: {level}")
    path.write_text(f"{head}{GRID}{traffic}budget: {{restarts: {budget}}}\nsearch: {search}\n")
    return path


def tune(folder: Path, path: Path, hosts: list[str]) -> dict:
    argv = [sys.executable, "-m", "orchestrator", "--profiles-dir", str(folder), "tune", str(path)]
    argv += ["--limit", ",".join(hosts), "--leave", "none", "--json"]
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if not done.stdout.strip():
        raise SystemExit(f"tune failed (rc {done.returncode}): {done.stderr[-2000:]}")
    outcome = json.loads(done.stdout)
    outcome["measured_wall_s"] = time.monotonic() - began
    return outcome


def runs(campaign: str, profile: str, factors: dict[str, float], level: int = 1) -> list[float]:
    """A point's decode tok/s at c=`level` in a campaign, run by run, each as a ratio to the
    baseline's mean, both on the average host's scale (`factors`: the campaign's fitted host speeds)."""
    conn = sqlite3.connect(state_dir() / "ledger.sqlite")
    rows = conn.execute(
        "SELECT host, profile, tok_s FROM bench_results WHERE sweep_id=? AND concurrency=? AND result='ok'",
        (campaign, level),
    ).fetchall()
    conn.close()
    base = [tok / factors.get(host, 1.0) for host, name, tok in rows if name == "baseline"]
    mean = sum(base) / len(base)
    return [tok / factors.get(host, 1.0) / mean for host, name, tok in rows if name == profile]


def simulate(seeds: int, accepts: list[float], levels: list[int], hosts: int) -> None:
    """The search in memory over three landscapes and two objectives (see the module docstring)."""
    import os
    import statistics
    from unittest import mock

    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    import tunesim  # type: ignore[import-not-found]

    from orchestrator.hosts import deploy as deploy_mod
    from orchestrator.tuning import bench, search, space, tune

    factors = dict(list({"lab1": 1.0, "lab2": 0.985, "lab3": 0.97, "lab4": 0.96}.items())[:hosts])
    grid = "vary:\n" + GRID
    work = Path(tempfile.mkdtemp(prefix="tune-sim-"))
    os.environ["SGLANG_STANDIN_EXACT"] = "1"
    print("landscape      level  winner (true gain)      found  restarts  model error  start")
    for accept in accepts:
        for level in levels:
            folder = work / f"a{accept}-c{level}"
            folder.mkdir()
            head = f"baseline: example:baseline\n{grid}"
            tail = (
                f"traffic: {{concurrency: [1, 8], requests: 4, max_tokens: 16, repeat: 2}}\n"
                f"objective: {{maximize: tok_s, at_concurrency: {level}}}\n"
            )
            probe = folder / "probe.yml"
            probe.write_text(f"extends: example:cg_5tok\n{head}{tail}")
            x = space.expand(probe)
            base = tunesim.model_of(x.baseline, level, accept).tok_s
            true = {p.key: tunesim.model_of(p.profile, level, accept).tok_s / base for p in x.valid}
            best = max(true, key=lambda k: true[k])
            ranks = search.rank_scales(x.space.vary)
            winner = next(p for p in x.valid if p.key == best)
            far = max(
                x.valid,
                key=lambda p: sum(
                    (ranks[k](p.params[k]) - ranks[k](winner.params[k])) ** 2 for k in p.params
                ),
            )
            start = folder / "start.yml"
            spec = {k.split(".")[1]: int(v) for k, v in far.params.items()}
            start.write_text(f"extends: example:cg_5tok\nspeculative: {json.dumps(spec)}\n")
            budget = (len(x.valid) + 1) // 4  # at most a quarter of the grid's restarts
            found, used, errors = 0, [], []
            for seed in range(seeds):
                path = folder / f"space{seed}.yml"
                path.write_text(
                    f"extends: {start}\n{head}{tail}"
                    f"budget: {{restarts: {budget}}}\nsearch: {{seed: {seed}}}\n"
                )
                lab = tunesim.Lab(dict(factors), seed=seed)
                lab.accept = accept
                state = folder / f"state{seed}"
                with (
                    mock.patch.dict(os.environ, {"ORCHESTRATOR_STATE_DIR": str(state)}),
                    mock.patch.object(deploy_mod, "deploy", lab.deploy),
                    mock.patch.object(bench, "run", lab.run),
                    mock.patch.object(
                        bench,
                        "deployed_target",
                        lambda inv, host, prof: bench.Target(host, "a", 1, prof.name),
                    ),
                    mock.patch.object(bench, "journal_lines", lab.journal_lines),
                ):
                    options = tune.Options(leave="none", profiles_dir=folder / "out")
                    o = tune.Campaign(space.expand(path), Path("inv"), list(factors), options).run()
                key = space.point_key(o.winner.params) if o.winner else ""
                ok = key in true and true[key] >= true[best] * (1 - 0.015)
                found += ok
                used.append(o.restarts)
                if o.model is not None and o.model.error is not None:
                    errors.append(o.model.error)
            err = f"{statistics.fmean(errors):.1%}" if errors else "-"
            print(
                f"accept {accept:<5}  c={level:<3}  {winner.label.replace('num_', '').replace('eagle_', '')} "
                f"({true[best]:.3f}x)  {found}/{seeds}   {statistics.fmean(used):.1f}/{budget}    {err:>6}"
                f"       {far.label}"
            )
            print(f"  restarts per seed: {used}; model error per seed: {[f'{e:.1%}' for e in errors]}")
    print(
        f"grid: {len(x.valid)} valid points + the baseline; budget at most a quarter of that; {hosts} host(s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--skip-hosts", action="store_true")
    parser.add_argument(
        "--hosts", type=int, default=4, choices=range(1, 5), help="hosts of each seeded campaign"
    )
    parser.add_argument(
        "--grid-id", metavar="CAMPAIGN", help="reuse this grid campaign (of the one --accept given)"
    )
    parser.add_argument("--simulate", action="store_true", help="the search in memory: no lab")
    parser.add_argument("--only-hosts", action="store_true", help="only 1 host against 4, on the lab")
    parser.add_argument(
        "--accept", type=float, action="append", help="drafters' accept_top1 (0.44, 0.3, 0.7)"
    )
    parser.add_argument("--level", type=int, action="append", help="scored concurrency (1, 8)")
    args = parser.parse_args()
    if args.simulate:
        simulate(args.seeds, args.accept or [0.44, 0.3, 0.7], args.level or [1, 8], args.hosts)
        return
    subprocess.run([sys.executable, "-m", "orchestrator", "lab", "up"], check=True, capture_output=True)
    work = Path(tempfile.mkdtemp(prefix="tune-quality-"))
    if args.only_hosts:
        hosts(work)
        return
    print("landscape        level  reference winner (gain)  found  restarts per seed     model error  start")
    for accept in args.accept or [0.44, 0.3, 0.7]:
        landscape(work, accept, args.level or [1, 8], args.seeds, HOSTS[: args.hosts], args.grid_id)
    if not args.skip_hosts:
        hosts(work)


def landscape(
    work: Path, accept: float, levels: list[int], seeds: int, on: list[str], grid_id: str | None = None
) -> None:
    """One drafter: the grid once on four hosts (both levels of the curve), then for each level
    `seeds` campaigns from the valid point farthest from that level's reference winner."""
    import statistics

    from orchestrator.tuning import search
    from orchestrator.tuning import space as space_mod

    folder = work / f"grid-a{accept}"
    profiles(folder, 1000, accept)
    path = space(folder, "{sampler: grid, early_stop: false, confirm: 0}", 30)
    if grid_id:  # the grid of an earlier run of the same drafter: the host factors fitted anew
        from orchestrator.profile import model as profile_mod
        from orchestrator.tuning import tune as tune_mod

        profile_mod._profiles_dir_option = folder
        old = tune_mod.Campaign(space_mod.expand(path), Path("inv"), ["lab1"], resume=grid_id)
        old._replay()
        fit = old.scores.fit(old.rows())
        grid = {"campaign_id": grid_id, "model": {"host_factors": fit.hosts if fit else {}}}
    else:
        grid = tune(folder, path, HOSTS)
    x = space_mod.expand(folder / "space.yml")
    suffix = {p.name.split(".", 1)[1]: p for p in x.valid}
    factors = (grid.get("model") or {}).get("host_factors") or {}
    ranks = search.rank_scales(x.space.vary)
    budget = (len(x.valid) + 1) // 4  # at most a quarter of the grid's restarts
    for level in levels:
        scored = {k: runs(grid["campaign_id"], f"cg_5tok.{k}", factors, level) for k in suffix}
        scored = {k: v for k, v in scored.items() if v}
        mean = {k: statistics.fmean(v) for k, v in scored.items()}
        ref = max(mean, key=lambda k: mean[k])
        far = max(
            x.valid,
            key=lambda p: sum(
                (ranks[k](p.params[k]) - ranks[k](suffix[ref].params[k])) ** 2 for k in p.params
            ),
        )
        spec = {k.split(".")[1]: int(v) for k, v in far.params.items()}
        found, used, errors, walls, notes = 0, [], [], [], []
        for seed in range(seeds):
            seeded = work / f"a{accept}-c{level}-seed{seed}"
            profiles(seeded, seed, accept)
            (seeded / "far.yml").write_text(f"extends: cg_5tok\nspeculative: {json.dumps(spec)}\n")
            o = tune(seeded, space(seeded, f"{{seed: {seed}}}", budget, "far", level), on)
            won = (o["winner"] or ".").split(".", 1)[1]
            close = won in mean and mean[won] >= mean[ref] * (1 - 0.015)
            welch = stats.compare(scored[won], scored[ref]).verdict if won in scored and won != ref else "-"
            ok = won == ref or close or welch == "within noise"
            found += ok
            used.append(o["restarts"])
            walls.append(o["measured_wall_s"])
            if (o.get("model") or {}).get("error") is not None:
                errors.append(o["model"]["error"])
            if not ok:
                notes.append(f"seed {seed}: {won or 'no winner'} {mean.get(won, 0):.3f}x ({welch})")
        err = f"{statistics.fmean(errors):.1%}" if errors else "-"
        print(
            f"accept_top1 {accept:<4} c={level:<3}  {ref} ({mean[ref]:.3f}x)        {found}/{seeds}   "
            f"{used} of {budget}  {err:>6}       {far.name.split('.', 1)[1]}"
        )
        print(f"  grid {grid['campaign_id']}: {len(scored)} points; each campaign "
              f"{statistics.fmean(walls):.0f} s on {len(on)} host(s); model error per seed "
              f"{[f'{e:.1%}' for e in errors]}")  # fmt: skip
        for n in notes:
            print(f"  missed: {n}")


def hosts(work: Path) -> None:
    """The same campaign (budget 9: the baseline and 8 trials) on 1 host and on 4; and what this
    machine allows: one
    restarting deploy onto 4 hosts in one play against one onto 1 host (the lab's hosts share this
    machine's cores, so 4 restarts at once are not 4 times the work done)."""
    walls = {}
    for n in (1, 4):
        folder = work / f"hosts{n}"
        profiles(folder, 77)
        o = tune(folder, space(folder, "{seed: 7, confirm: 0}", 9), HOSTS[:n])
        trials = sum(1 for t in o["trials"] if t["kind"] == "trial")
        walls[n] = o["measured_wall_s"]
        print(f"{n} host(s): {trials} trials, {o['restarts']} restarts, {walls[n]:.0f} s wall")
    print(f"4 hosts / 1 host wall time: {walls[4] / walls[1]:.2f}x (goal <= 0.4x)")
    deploys = {}
    for n in (1, 4, 1, 4):
        took = []
        for name in ("baseline", "cg_5tok"):
            argv = [
                sys.executable,
                "-m",
                "orchestrator",
                "deploy",
                "--profile",
                name,
                "--limit",
                ",".join(HOSTS[:n]),
            ]
            began = time.monotonic()
            subprocess.run(argv, check=True, capture_output=True)
            took.append(time.monotonic() - began)
        deploys.setdefault(n, []).extend(took)
    one, four = (sorted(deploys[n])[len(deploys[n]) // 2] for n in (1, 4))
    print(f"a restarting deploy: 1 host {one:.1f} s, 4 hosts in one play {four:.1f} s ({four / one:.2f}x):")
    print(f"  for the same restarts, 4 hosts here cannot do better than about {four / one / 4:.2f}x of 1")


if __name__ == "__main__":
    main()
