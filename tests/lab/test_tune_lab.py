"""tune on the lab: a small space on two hosts at once, for real (deploys through Ansible, benches
against the stand-in). One campaign covers what a user would notice: `--check` lists the trials
and pruned points and changes nothing; a point that cannot start (a memory fraction the server
dies on) is recorded and skipped; Ctrl-C mid-campaign and `--resume` on another control machine
(its own state directory, the team's PostgreSQL ledger) measure nothing twice, while a third
machine's resume of the running campaign is refused; the winner is written as a profile that
validates and deploys. Its objective is a latency (p99 ITL with a floor on tok/s), and the two
hosts share one baseline. The search itself (which points, early stopping, ties, the budget) is
unit-tested against the stand-in's speed model (tests/unit/test_tune.py).
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from labutil import control, orchestrator, service, ssh
from orchestrator.paths import ROOT

pytestmark = pytest.mark.lab

HOSTS = ("lab1", "lab2")
SPACE = f"""\
extends: cg_5tok
baseline: baseline
vary:
  speculative.num_steps: [2, 3]
  speculative.num_draft_tokens: [4, 16]
  server.mem_fraction_static: [null, 0.97]
traffic:
  endpoint: chat
  dataset: {ROOT / "tests/data/datasets/code.jsonl"}
  concurrency: [1, 4]
  requests: 4
  max_tokens: 16
  warmup: 1
  repeat: 2
objective: {{minimize: p99_itl_ms, at_concurrency: 4, tok_s_min: 5}}
budget: {{restarts: 8}}
search: {{seed: 3, confirm: 1}}
"""


@functools.cache
def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url, poolclass=NullPool)  # no connection outlives a read: the db is dropped


def ledger_rows(url: str, query: str, **args: Any) -> list[sa.RowMapping]:
    """The rows of `query` (:name parameters) in the PostgreSQL ledger at `url`."""
    try:
        with _engine(url).connect() as conn:
            return list(conn.execute(sa.text(query), args).mappings())
    except sa.exc.ProgrammingError as exc:  # the campaign's first write migrates the ledger
        if getattr(exc.orig, "sqlstate", "") == "42P01":  # undefined table
            return []
        raise


def test_a_campaign_on_two_hosts_survives_ctrl_c_and_writes_a_winner_that_deploys(
    lab, tmp_path: Path, pg_url: str
) -> None:
    """Two control machines share one PostgreSQL ledger: the campaign begins on the first, is cut
    off by Ctrl-C, and the second resumes it; a third's resume meanwhile is refused."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    for name in ("base", "cg_5tok", "baseline"):
        (folder / f"{name}.yml").write_text((ROOT / "profiles" / f"{name}.yml").read_text())
    space = tmp_path / "space.yml"
    space.write_text(SPACE)
    states = [tmp_path / f"control{k}" for k in (1, 2, 3)]
    first, second, third = (control(state, pg_url) for state in states)
    where = ["--profiles-dir", str(folder)]
    byname = {h.name: h for h in lab.hosts}
    inv = ["-i", str(lab.inventory), "--limit", ",".join(HOSTS)]
    started = {h: service(byname[h])["ExecMainStartTimestamp"] for h in HOSTS}
    deploys_before = len(ledger_rows(pg_url, "SELECT id FROM deploys"))

    check = orchestrator(*where, "tune", str(space), *inv, "--check", env=first)
    assert check.returncode == 0, check.stderr
    print(check.stdout)
    said = " ".join(check.stdout.split())  # as one line, however rich wrapped it
    assert "4 trials, 4 pruned of 8 points" in said
    assert (
        "pruned num_steps=2 num_draft_tokens=16 mem_fraction_static=default: speculative.num_draft_tokens: "
        in said
    )
    assert "16 exceeds num_steps x eagle_topk + 1 = 9" in said
    assert "estimate: " in said and "nothing was changed (--check)" in said
    assert len(ledger_rows(pg_url, "SELECT id FROM deploys")) == deploys_before  # no host touched
    assert {h: service(byname[h])["ExecMainStartTimestamp"] for h in HOSTS} == started

    began = time.time()
    argv = [sys.executable, "-m", "orchestrator", *where, "tune", str(space), *inv, "--json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=first)
    try:
        campaign = ""
        while time.time() - began < 300:  # Ctrl-C once the baseline and two trials are in
            rows = ledger_rows(pg_url, "SELECT * FROM trials WHERE time>=:t ORDER BY id", t=began)
            if sum(r["kind"] == "trial" for r in rows) >= 2 and any(r["kind"] == "baseline" for r in rows):
                campaign = rows[0]["campaign_id"]
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.5)
        assert campaign, "no trial finished in 300 s"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:  # a failed test leaves no campaign running (it would hold the hosts' locks)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)
    assert f"--resume {campaign}" in err
    before = ledger_rows(pg_url, "SELECT * FROM trials WHERE campaign_id=:c", c=campaign)
    measured = {r["profile"] for r in before}
    assert len([r for r in before if r["kind"] == "baseline"]) == 1  # one baseline serves both hosts
    runs_query = "SELECT curve_id FROM bench_results WHERE sweep_id=:c"
    runs_before = Counter(r["curve_id"] for r in ledger_rows(pg_url, runs_query, c=campaign))

    # The second control machine resumes it. Once it holds the campaign, the third's resume is
    # refused, naming it, before any host changes (its only play reads the model files).
    resume = [*where, "tune", str(space), "-i", str(lab.inventory), "--resume", campaign, "--json"]
    argv = [sys.executable, "-m", "orchestrator", *resume]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=second)
    try:
        holder, waited = "", time.time()
        while time.time() - waited < 120:
            (row,) = ledger_rows(pg_url, "SELECT holder FROM campaigns WHERE id=:c", c=campaign)
            holder = row["holder"]
            if holder:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        assert holder.endswith(f" pid {proc.pid}"), holder
        refused = orchestrator(*resume, env=third, timeout=120)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert f"campaign {campaign} is being run by {holder} (heard from" in " ".join(refused.stderr.split())
    plays = {run.name.split("-")[2] for run in (states[2] / "runs").glob("*")}
    assert plays <= {"preflight"}, plays  # the third only read the hosts: no deploy, no stop
    done = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    assert done.returncode == 0, (done.stdout, done.stderr)
    outcome = json.loads(done.stdout)
    print(json.dumps({k: outcome[k] for k in ("verdict", "restarts", "grid", "wall_s", "winner", "leaders")}))
    for level in outcome["levels"]:
        print(level["level"], [(r["setting"], round(r["tok_s"], 1), r["speedup"]) for r in level["rows"]])

    # nothing measured twice: no point the first run finished is searched again, nor the baselines,
    # and no run of its trials is taken again
    last = max(r["id"] for r in before)
    after = ledger_rows(pg_url, "SELECT * FROM trials WHERE campaign_id=:c AND id>:i", c=campaign, i=last)
    assert {r["profile"] for r in after if r["kind"] == "trial"}.isdisjoint(measured)
    assert not [r for r in after if r["kind"] == "baseline"]
    searched = Counter(r["point"] for r in [*before, *after] if r["kind"] == "trial")
    assert set(searched.values()) == {1}, searched  # each point once, over both machines
    runs_after = Counter(r["curve_id"] for r in ledger_rows(pg_url, runs_query, c=campaign))
    kept = {r["curve_id"] for r in before}
    assert {c: runs_after[c] for c in kept} == {c: runs_before[c] for c in kept}
    trials = outcome["trials"]
    assert len([t for t in trials if t["kind"] == "baseline"]) == 1
    assert outcome["objective"] == "minimize p99 ITL at c=4 (tok/s of one request at least 5)"
    assert set(outcome["model"]["host_factors"]) == set(HOSTS)  # both hosts on one scale
    c4 = next(level["rows"] for level in outcome["levels"] if level["level"].endswith("c=4"))
    assert all(r["p99_itl_ms"] > 0 for r in c4)  # what the objective scored, shown per setting
    assert outcome["restarts"] <= 8
    # the point that cannot start: recorded with the server's own reason, and the campaign went on
    failed = [t for t in trials if t["state"] == "failed"]
    assert failed and all('"server.mem_fraction_static":"0.97"' in t["point"] for t in failed)
    assert all("out of memory" in t["diagnosis"].lower() for t in failed), failed
    assert len(outcome["pruned"]) == 4
    assert {t["host"] for t in trials if t["kind"] == "trial"} == set(HOSTS)  # both hosts ran trials

    # the winner: a new profile file that extends cg_5tok, validates, and is what runs now
    assert outcome["winner"] and outcome["winner_file"].startswith(str(folder))
    winner = Path(outcome["winner_file"])
    assert "extends: cg_5tok" in winner.read_text()
    assert orchestrator(*where, "validate", "-p", str(winner), env=second).returncode == 0
    deployed = orchestrator(*where, "deploy", "-p", str(winner), "-i", str(lab.inventory), "--limit", "lab1",
                            "--json", env=second)  # fmt: skip
    assert deployed.returncode == 0, deployed.stdout
    assert json.loads(deployed.stdout)["hosts"][0]["ok"]
    assert outcome["left_ok"]
    assert all(
        ssh(byname[h], "ls", "-A", "/run/orchestrator") == "" for h in HOSTS
    )  # the campaign's lock is gone
    assert not [s for s in states if (s / "ledger.sqlite").exists()]  # all of it went to PostgreSQL


def test_a_goodput_campaign_reads_the_most_load_off_the_request_rate_curve(lab, tmp_path: Path) -> None:
    """goodput over an open-loop curve on one host: each trial's value is the request rate at which
    its p99 ITL crosses the limit, against the baseline's. On raw text plain decode keeps 20 ms at
    both rates (about 12 and 13 ms), 8 draft tokens cross it between them (about 18 and 24 ms): the
    crossing is read off the curve, and the verdict says the curve is too short to rank the
    baseline."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    for name in ("base", "cg_5tok", "baseline"):
        (folder / f"{name}.yml").write_text((ROOT / "profiles" / f"{name}.yml").read_text())
    space = tmp_path / "space.yml"
    space.write_text(
        "extends: cg_5tok\nbaseline: baseline\nvary:\n  speculative.num_draft_tokens: [4, 8]\n"
        "traffic: {endpoint: generate, request_rate: [2, 16], requests: 8, max_tokens: 16, warmup: 1, "
        "repeat: 1}\nobjective: {goodput: {p99_itl_ms: 20}}\nbudget: {restarts: 3}\nsearch: {confirm: 0}\n"
    )
    done = orchestrator("--profiles-dir", str(folder), "tune", str(space), "-i", str(lab.inventory),
                        "--limit", "lab3", "--leave", "none", "--json", timeout=600)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    outcome = json.loads(done.stdout)
    print(json.dumps({k: outcome[k] for k in ("verdict", "restarts", "objective", "per_load_line")}))
    for level in outcome["levels"]:
        print(level["level"], [(r["setting"], r["p99_itl_ms"]) for r in level["rows"]])
    assert outcome["objective"] == "goodput: the most load with p99 ITL under 20 ms"
    assert outcome["restarts"] == 3
    assert [level["level"].rsplit(", ", 1)[-1] for level in outcome["levels"]] == ["2/s", "16/s"]
    trials = [t for t in outcome["trials"] if t["kind"] == "trial"]
    assert len(trials) == 2 and all(t["state"] in ("complete", "infeasible") for t in trials), trials
    assert all(t["value"] is not None and 0 <= t["value"] <= 1 for t in trials)  # the baseline keeps 16/s
    eight = next(t for t in trials if json.loads(t["point"])["speculative.num_draft_tokens"] == "8")
    assert 0 < eight["value"] < 1  # 2/s kept, 16/s not: the crossing, interpolated
    assert outcome["verdict"].startswith(
        "over the curve the baseline keeps the limits up to the highest load"
    )


def test_sglang_adaptive_mode_is_measured_on_a_0_5_23_host(lab, tmp_path: Path) -> None:
    """On SGLang 0.5.23 the campaign also runs --speculative-adaptive with tiers of its own per-level
    winners: the server logs SGLang's own start line for it, and the outcome puts each level against
    the best static setting there."""
    host = next(h for h in lab.hosts if h.name == "lab4")
    folder = tmp_path / "profiles"
    folder.mkdir()
    for name in ("base", "cg_5tok", "baseline"):
        (folder / f"{name}.yml").write_text((ROOT / "profiles" / f"{name}.yml").read_text())
    for name, extends in (("start", "cg_5tok"), ("plain", "baseline")):
        (folder / f"{name}.yml").write_text(f"extends: {extends}\nserver: {{sglang_version: '0.5.23'}}\n")
    space = tmp_path / "space.yml"
    space.write_text(
        "extends: start\nbaseline: plain\nvary:\n  speculative.num_steps: [1, 3]\n"
        "  speculative.eagle_topk: [1]\n  speculative.num_draft_tokens: [2, 4]\n"
        f"traffic: {{endpoint: chat, dataset: {ROOT / 'tests/data/datasets/code.jsonl'}, concurrency: [1, 8],"
        " requests: 8, max_tokens: 32, warmup: 1, repeat: 2}\n"
        "objective: {maximize: tok_s, at_concurrency: 1}\nbudget: {restarts: 5}\nsearch: {confirm: 1}\n"
    )
    ssh(host, "python3", "-m", "sglang._set_version", "0.5.23")
    try:
        done = orchestrator("--profiles-dir", str(folder), "tune", str(space), "-i", str(lab.inventory),
                            "--limit", "lab4", "--leave", "none", "--json", timeout=600)  # fmt: skip
        log = ssh(host, "journalctl", "-u", "sglang.service", "--no-pager", "-n", "400")
    finally:
        ssh(host, "python3", "-m", "sglang._set_version", "0.5.9")
    assert done.returncode in (0, 1), done.stderr
    outcome = json.loads(done.stdout)
    adaptive = outcome["adaptive"]
    print(adaptive["line"])
    assert adaptive["skipped"] == "", adaptive
    assert adaptive["tiers"] == {"1": [3], "3": [0]}  # 3 steps win at c=1, plain decode at c=8
    assert [r["load"] for r in adaptive["levels"]] == ["c=1", "c=8"]
    trial = [t for t in outcome["trials"] if t["kind"] == "adaptive"]
    assert len(trial) == 1 and trial[0]["state"] == "complete", trial
    assert "AdaptiveSpeculativeParams initialized" in log  # SGLang's own start line, from the unit
    assert outcome["restarts"] <= 5
