"""A team's ledger on the lab (issue 43): control machines with their own state directories record
in one PostgreSQL. Two deploy at once, one to lab1 and one to lab2, then bench at once, each its
host; `history` and `results` from either show both, each row naming the machine that wrote it.
A third machine's SQLite ledger is pushed in, once. (A campaign one machine began and another
resumes is test_tune_lab's.)

Each machine is a `python3 -m orchestrator` process with its own ORCHESTRATOR_STATE_DIR; the lab's
inventory names its keys by absolute paths, so every one of them reaches the hosts.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labutil import GOOD, control, orchestrator

pytestmark = pytest.mark.lab

#: The lab's hosts run GOOD between tests: a deploy of it is a restart at most.
HOSTS = ("lab1", "lab2")
#: The third machine's host: its deploy runs beside the other two, into its own SQLite ledger.
ALONE = "lab3"
#: A load the stand-in answers in well under a second.
LOAD = ["--requests", "2", "--concurrency", "2", "--max-tokens", "32", "--warmup", "0"]


def start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "orchestrator", *args, "--json"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(procs: dict[str, subprocess.Popen[str]]) -> dict[str, Any]:
    """Each process's JSON, once all have ended (none is left running if one fails)."""
    try:
        done = {name: (p, *p.communicate(timeout=300)) for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for name, (p, out, err) in done.items():
        assert p.returncode == 0, f"{name}: rc {p.returncode}\n{out}\n{err}"
    return {name: json.loads(out) for name, (_, out, _) in done.items()}


def run_json(env: dict[str, str], *args: str) -> Any:
    done = orchestrator(*args, env=env)
    assert done.returncode == 0, f"{args}: rc {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout)


def test_two_control_machines_deploy_and_bench_at_once_into_one_postgresql_ledger(
    lab, tmp_path: Path, pg_url: str
) -> None:
    inv = ["-i", str(lab.inventory)]
    machines = {host: control(tmp_path / f"control-{host}", pg_url) for host in HOSTS}
    alone = control(tmp_path / "control-alone")  # its own SQLite ledger, pushed in at the end
    here = socket.gethostname()  # the machine every row names: all three run here

    deploy = ["deploy", "--profile", GOOD, *inv, "--limit"]
    procs = {host: start(env, *deploy, host) for host, env in machines.items()}
    procs[ALONE] = start(alone, *deploy, ALONE)
    deploys = finish(procs)
    for host, report in deploys.items():
        assert report["ok"] and [h["host"] for h in report["hosts"]] == [host], report
    bench = ["bench", *inv, *LOAD, "--limit"]
    benches = finish({host: start(env, *bench, host) for host, env in machines.items()})
    for host, row in benches.items():
        assert (row["host"], row["profile"], row["result"]) == (host, GOOD, "ok") and row["tok_s"] > 0, row

    # either machine sees both: the deploys and the bench rows, each naming where it was written
    deployed = sorted((host, deploys[host]["run_id"], here) for host in HOSTS)
    benched = sorted((host, benches[host]["ledger_id"], here) for host in HOSTS)
    for env in machines.values():
        history = run_json(env, "history", "--json")
        assert sorted((r["host"], r["run_id"], r["origin"]) for r in history) == deployed
        results = run_json(env, "results", "--format", "json")
        assert sorted((r["host"], r["id"], r["origin"]) for r in results) == benched
    status = run_json(machines["lab1"], "ledger", "status", "--json")
    assert (status["engine"], status["source"]) == ("postgresql", "ORCHESTRATOR_LEDGER") and status["exists"]
    assert status["version"] == status["newest"] and list(status["machines"]) == [here]
    counts = {"deploys": 2, "bench_results": 2, "good_units": 2, "last_good": 2, "campaigns": 0, "trials": 0}
    assert {t: status["rows"][t] for t in counts} == counts
    assert not [host for host in HOSTS if (tmp_path / f"control-{host}" / "ledger.sqlite").exists()]

    # the third machine's deploy is in its SQLite file; pushed, it is in the team's ledger, once
    mine = run_json(alone, "ledger", "status", "--json")
    assert (mine["engine"], mine["rows"]["deploys"]) == ("sqlite", 1), mine
    pushed = run_json(alone, "ledger", "push", pg_url, "--json")
    source = tmp_path / "control-alone" / "ledger.sqlite"  # pushed again, from another machine
    again = run_json(machines["lab1"], "ledger", "push", pg_url, "--from", str(source), "--json")
    history = run_json(machines["lab2"], "history", "--json")
    (row,) = [r for r in history if r["host"] == ALONE]
    assert (row["run_id"], row["origin"]) == (deploys[ALONE]["run_id"], here)
    assert row["pushed_from"].startswith(f"{mine['ledger_id']}:1@")  # the SQLite ledger's id and the row's
    assert len(history) == 3
    copied = {"deploys": 1, "good_units": 1, "last_good": 1, "bench_results": 0, "campaigns": 0, "trials": 0}
    assert {t: pushed["copied"][t] for t in copied} == copied, pushed
    assert not any(again["copied"].values()), again  # a second push copies nothing
    assert {t: again["had"][t] for t in copied} == copied, again
