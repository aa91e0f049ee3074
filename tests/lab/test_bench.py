"""bench and sweep on the lab: the numbers are the stand-in's model's, and a sweep ranks, records
and restores as a user relies on. Speeds are printed; only the issue's 3% agreement is asserted.

The profiles deployed here carry the stand-in's exact mode (env SGLANG_STANDIN_EXACT=1: no run
noise, no host factor), so one run can be compared with the model at 3%."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from labutil import orchestrator, ssh, write_profile
from orchestrator import ledger
from orchestrator.paths import ROOT
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch
from orchestrator.tuning import bench

pytestmark = pytest.mark.lab

AGREE = 0.03
#: Small loads keep the tests short (at 90 tok/s 64 tokens take 0.7 s); two streams at once
#: share decode rounds, each a little slower than alone (the model's batch term, batch 2).
CONCURRENCY = 2
LOAD = ["--requests", "2", "--concurrency", str(CONCURRENCY), "--max-tokens", "96", "--warmup", "1"]


def speed_model():
    """The stand-in's own speed model (sglang/_speed.py), to predict what the lab must measure."""
    path = ROOT / "orchestrator/lab/standins/host/sglang/_speed.py"
    spec = importlib.util.spec_from_file_location("lab_standin_speed", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def exact(tmp_path, profile: str) -> str:
    """`profile` with the stand-in in exact mode, as a profile file `<profile>_exact.yml`."""
    text = f'description: {profile}, stand-in exact\nextends: {profile}\nenv:\n  SGLANG_STANDIN_EXACT: "1"\n'
    return write_profile(tmp_path, f"{profile}_exact", text)


def predicted(profile: str, batch: int = CONCURRENCY) -> tuple[float, float]:
    """(tok/s of one stream, accept length) the stand-in gives `profile` (a name or a file) on a lab
    host (base 90 tok/s) with `batch` streams at once; bench's prompts are plain English raw text
    at temperature 0, so the drafter's accept_top1 applies unchanged."""
    speed, prof = speed_model(), profile_mod.load(profile)
    s = prof.speculative
    settings = speed.SpecSettings(s.num_steps, s.eagle_topk, s.num_draft_tokens) if s.algorithm else None
    model = speed.decode_model(speed.BASE_TOK_S, settings, prof.server.cuda_graph, batch=batch)
    return model.tok_s, model.accept_len


def run_json(name: str, *args: str, ok: bool = True, timeout: float = 300) -> dict:
    done = orchestrator(name, *args, "--json", timeout=timeout)
    if ok:
        assert done.returncode == 0, f"rc {done.returncode}\n{done.stdout}\n{done.stderr}"
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"rc {done.returncode}\nstdout: {done.stdout}\nstderr: {done.stderr}") from None


def test_bench_reports_the_standins_speed_and_accept_length(lab, tmp_path) -> None:
    inv, cg_5tok = str(lab.inventory), exact(tmp_path, "cg_5tok")
    run_json("deploy", "--profile", cg_5tok, "-i", inv, "--limit", "lab3")
    row = run_json("bench", "--profile", cg_5tok, "-i", inv, "--limit", "lab3", *LOAD)
    tok_s, accept = predicted(cg_5tok)
    print(
        f"\nlab3 cg_5tok: bench {row['tok_s']:.2f} tok/s (total {row['total_tok_s']:.2f}), stand-in model "
        f"{tok_s:.2f}; accept {row['accept_len']} (log {row['accept_len_log']}, "
        f"client {row['accept_len_client']:.3f}), model {accept:.4f}"
    )
    assert (row["host"], row["address"], row["port"]) == ("lab3", "10.213.0.13", 30000)
    assert row["tok_s"] == pytest.approx(tok_s, rel=AGREE)
    # the server's figure is its mean since it started; the run's own is the requests' count
    assert row["accept_len_server_cumulative"] == pytest.approx(accept, abs=1e-3)
    assert row["accept_len"] == row["accept_len_client"] == pytest.approx(accept, rel=bench.ACCEPT_TOLERANCE)
    assert row["accept_len_log"] == pytest.approx(accept, abs=0.01)
    plan_digest = launch.build(profile_mod.load(cg_5tok)).digest
    assert (row["profile"], row["digest"], row["plan_digest"]) == ("cg_5tok_exact", plan_digest, plan_digest)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert (row["sglang_version"], row["git_commit"], row["errors"]) == ("0.5.9", head.stdout.strip(), 0)
    assert row["notes"] == ""
    stored = {r["id"]: dict(r) for r in ledger.bench_results(profile="cg_5tok_exact")}[row["ledger_id"]]
    assert stored["tok_s"] == row["tok_s"]
    run_json("deploy", "--profile", "cg_5tok", "-i", inv, "--limit", "lab3")  # as the lab had it


def test_sweep_ranks_as_the_model_predicts_records_a_failure_and_leaves_the_best(lab, tmp_path) -> None:
    broken = write_profile(
        tmp_path,
        "cg_5tok_oom",
        "description: cg_5tok with too much static memory, no room left for CUDA graphs\n"
        "extends: cg_5tok\nserver:\n  mem_fraction_static: 0.97\n",
    )
    inv = str(lab.inventory)
    load = ["--requests", "2", "--concurrency", str(CONCURRENCY), "--max-tokens", "64", "--warmup", "1"]
    # The fastest (baseline) last: the restore at the end finds it running and changes nothing.
    files = {f"{p}_exact": exact(tmp_path, p) for p in ("cg_5tok", "cg_2step", "baseline")}
    profiles = [files["cg_5tok_exact"], files["cg_2step_exact"], broken, files["baseline_exact"]]
    report = run_json("sweep", *profiles, "-i", inv, "--limit", "lab2", *load, ok=False)
    print("\nsweep on lab2 (tok/s, speed-up, accept length; model tok/s):")
    for e in report["ranking"]:
        if e["ok"]:
            numbers = f"{e['mean_tok_s']:.2f}, x{e['speedup']:.3f}, {e['accept_len']:.2f}"
            print(f"  {e['profile']}: {numbers}; {predicted(files[e['profile']])[0]:.2f}")
        else:
            print(f"  {e['profile']}: failed: {e['diagnosis'][:100]}")
    healthy = [e["profile"] for e in report["ranking"] if e["ok"]]
    assert healthy == sorted(files, key=lambda p: -predicted(files[p])[0])
    for e in report["ranking"][:3]:
        assert e["mean_tok_s"] == pytest.approx(predicted(files[e["profile"]])[0], rel=AGREE)
    failed = report["ranking"][-1]
    assert (failed["profile"], failed["ok"]) == ("cg_5tok_oom", False)
    # preflight's memory fit refuses it before the stop: lab2 kept serving the profile before it
    assert "runs out of memory" in failed["diagnosis"] and "nothing was stopped" in failed["diagnosis"]
    rows = [r for r in ledger.bench_results() if r["sweep_id"] == report["sweep_id"]]
    assert sorted(r["result"] for r in rows) == ["failed", "ok", "ok", "ok"]
    for r in rows:  # each bench read the accept length from the server and its journal
        if r["result"] == "ok" and r["speculative"]:
            assert r["accept_len_log"] == pytest.approx(predicted(files[r["profile"]])[1], abs=0.01)
    assert (report["left"], report["left_ok"]) == (healthy[0], True)
    unit = ssh(next(h for h in lab.hosts if h.name == "lab2"), "cat", "/etc/systemd/system/sglang.service")
    assert f"# profile: {healthy[0]}" in unit


def test_bench_warns_when_the_drafter_does_not_help(lab, tmp_path) -> None:
    # The reference failure: an EAGLE-3 drafter under EAGLE starts fine and runs at accept 1.00.
    # Preflight refuses it (test_preflight); forced past preflight, bench must still say so.
    eagle = write_profile(tmp_path, "cg_5tok_eagle", "extends: cg_5tok\nspeculative:\n  algorithm: EAGLE\n")
    inv = str(lab.inventory)
    run_json("deploy", "--profile", eagle, "-i", inv, "--limit", "lab3", "--no-preflight")
    row = run_json("bench", "-i", inv, "--limit", "lab3", *LOAD)
    assert row["accept_len"] == pytest.approx(1.0, abs=0.01)
    assert row["notes"].startswith("drafter not helping: check algorithm and drafter: accept length 1.00")
    (status,) = run_json("status", "-i", inv, "--limit", "lab3")  # what a glance at the fleet shows
    assert status["speculative"] and status["accept_len"] == pytest.approx(1.0, abs=0.01)
    table = orchestrator("status", "-i", inv, "--limit", "lab3")
    assert "drafter not helping" in table.stdout.replace("\n", " "), table.stdout
    run_json("deploy", "--profile", "cg_5tok", "-i", inv, "--limit", "lab3")
