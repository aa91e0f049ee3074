"""tune on the lab: a small space on two hosts at once, for real (deploys through Ansible, benches
against the stand-in). One campaign covers what a user would notice: `--check` lists the trials
and pruned points and changes nothing; a point that cannot start (a memory fraction the server
dies on) is recorded and skipped; Ctrl-C mid-campaign and `--resume` measure nothing twice; the
winner is written as a profile that validates and deploys. The search itself (which points, early
stopping, ties, the budget) is unit-tested against the stand-in's speed model (tests/unit/test_tune.py).
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labutil import orchestrator, service, ssh
from orchestrator.paths import ROOT, state_dir

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
objective: {{maximize: tok_s, at_concurrency: 1}}
budget: {{restarts: 8}}
search: {{sampler: grid, seed: 3, confirm: 1}}
"""


def ledger_rows(query: str, *args: object) -> list[sqlite3.Row]:
    conn = sqlite3.connect(state_dir() / "ledger.sqlite")
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(query, args).fetchall()
    except sqlite3.OperationalError as exc:  # the campaign's first write migrates the ledger
        if "no such table" in str(exc):
            return []
        raise
    finally:
        conn.close()


def test_a_campaign_on_two_hosts_survives_ctrl_c_and_writes_a_winner_that_deploys(
    lab, tmp_path: Path
) -> None:
    folder = tmp_path / "profiles"
    folder.mkdir()
    for name in ("base", "cg_5tok", "baseline"):
        (folder / f"{name}.yml").write_text((ROOT / "profiles" / f"{name}.yml").read_text())
    space = tmp_path / "space.yml"
    space.write_text(SPACE)
    where = ["--profiles-dir", str(folder)]
    byname = {h.name: h for h in lab.hosts}
    inv = ["-i", str(lab.inventory), "--limit", ",".join(HOSTS)]
    started = {h: service(byname[h])["ExecMainStartTimestamp"] for h in HOSTS}
    deploys_before = len(ledger_rows("SELECT id FROM deploys"))

    check = orchestrator(*where, "tune", str(space), *inv, "--check")
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
    assert len(ledger_rows("SELECT id FROM deploys")) == deploys_before  # no host touched
    assert {h: service(byname[h])["ExecMainStartTimestamp"] for h in HOSTS} == started

    began = time.time()
    argv = [sys.executable, "-m", "orchestrator", *where, "tune", str(space), *inv, "--json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        campaign = ""
        while time.time() - began < 300:  # Ctrl-C once both baselines and a round of trials are in
            rows = ledger_rows("SELECT * FROM trials WHERE time>=? ORDER BY id", began)
            if sum(r["kind"] == "trial" for r in rows) >= 2:
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
    before = ledger_rows("SELECT * FROM trials WHERE campaign_id=?", campaign)
    measured = {r["profile"] for r in before}
    assert {r["host"] for r in before if r["kind"] == "baseline"} == set(HOSTS)

    done = orchestrator(*where, "tune", str(space), "-i", str(lab.inventory), "--resume", campaign, "--json",
                        timeout=600)  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    outcome = json.loads(done.stdout)
    print(json.dumps({k: outcome[k] for k in ("verdict", "restarts", "grid", "wall_s", "winner", "leaders")}))
    for level in outcome["levels"]:
        print(level["level"], [(r["setting"], round(r["tok_s"], 1), r["speedup"]) for r in level["rows"]])

    # nothing measured twice: no point the first run finished is searched again, nor the baselines
    after = ledger_rows(
        "SELECT * FROM trials WHERE campaign_id=? AND id>?", campaign, max(r["id"] for r in before)
    )
    assert {r["profile"] for r in after if r["kind"] == "trial"}.isdisjoint(measured)
    assert not [r for r in after if r["kind"] == "baseline"]
    trials = outcome["trials"]
    assert len([t for t in trials if t["kind"] == "baseline"]) == 2
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
    assert orchestrator(*where, "validate", "-p", str(winner)).returncode == 0
    deployed = orchestrator(*where, "deploy", "-p", str(winner), "-i", str(lab.inventory), "--limit", "lab1",
                            "--json")  # fmt: skip
    assert deployed.returncode == 0, deployed.stdout
    assert json.loads(deployed.stdout)["hosts"][0]["ok"]
    assert outcome["left_ok"]
    assert all(
        ssh(byname[h], "ls", "-A", "/run/orchestrator") == "" for h in HOSTS
    )  # the campaign's lock is gone
