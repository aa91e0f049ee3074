"""A start seen from the server's own log, on a lab host: the phases live (deploy --json's lines)
and recorded (report, ledger, history), a stall in each phase failed within its own limit with a
diagnosis naming the phase and rolled back, and the compile cache kept across restarts."""

from __future__ import annotations

import json

import pytest
from test_failures import assert_rolled_back, provoke

from labutil import on_good, orchestrator, service, ssh, variant

pytestmark = pytest.mark.lab


@pytest.fixture
def host(lab):
    """lab1 on the known good profile: the ledger has a healthy start of its model there."""
    return on_good(lab)


def test_phases_are_shown_live_and_recorded(lab, host, tmp_path):
    """A 12 s load: the wait reports every 5 s (JSON lines on stderr naming phase and progress),
    the report says where the start went, and the ledger and `history` keep the phases."""
    ref = variant(tmp_path, "slow_start", env={"SGLANG_STANDIN_LOAD_DELAY_S": "12"})
    done = orchestrator("deploy", "-i", str(lab.inventory), "-p", ref, "--limit", host.name, "--json")
    assert done.returncode == 0, done.stderr
    live = [json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"event": "startup"')]
    assert len(live) >= 2, done.stderr
    assert {e["host"] for e in live} == {host.name}
    assert {e["phase"] for e in live} & {"weights", "graphs"}, live
    assert all(e["eta_s"] is None or e["eta_s"] >= 0 for e in live)
    (h,) = json.loads(done.stdout)["hosts"]
    phases = [p["phase"] for p in h["phases"]]
    assert phases[:4] == ["launch", "init", "weights", "kv_cache"] and "graphs" in phases, phases
    assert "draft" in phases and "warmup" in phases
    weights = next(p["s"] for p in h["phases"] if p["phase"] == "weights")
    assert 5 < weights < 10, h["phases"]  # 0.6 x 12 s
    assert h["startup"].startswith("healthy after ") and "weights" in h["startup"], h["startup"]
    shown = orchestrator("history", "--host", host.name, "--last", "1")
    assert "weights" in shown.stdout, shown.stdout


PHASES = ["init", "weights", "kv_cache", "graphs", "draft", "draft_graphs", "warmup"]


@pytest.mark.parametrize("phase", PHASES)
def test_a_stall_fails_within_its_phases_limit_names_it_and_is_rolled_back(lab, host, tmp_path, phase):
    """The stand-in stops in `phase` for good; the history of lab starts makes its limit the
    floor (3 s), so it fails seconds after its last line, not at the 1,800 s health timeout."""
    ref = variant(
        tmp_path,
        f"stall_{phase}",
        env={"SGLANG_STANDIN_STALL": phase},
        service={"stall_floor_s": 3},
    )
    h, took = provoke(lab, host, f"stall in {phase}", ref)
    assert h["step"] == "health"
    assert h["diagnosis"].startswith(f"start-up stalled in {label(phase)}: no new log line for"), h[
        "diagnosis"
    ]
    assert "(limit 3 s)" in h["diagnosis"]
    if phase == "init":  # the known hang names the profile's NCCL variables
        assert "NCCL_PROTO=LL" in h["diagnosis"] and "NCCL_ALGO=Ring" in h["diagnosis"]
    assert took < 60, took
    assert_rolled_back(h, host)


def label(phase: str) -> str:
    from orchestrator.hosts import startup_watch

    return startup_watch.label(phase)


def test_a_second_start_reuses_the_compile_cache(lab, host, tmp_path):
    """DeepGEMM's JIT (3 s cold in the stand-in) runs once: the cache directory systemd keeps for
    the unit, owned by its user, still holds it at the next start of the same profile."""
    ref = variant(tmp_path, "jit", env={"SGLANG_STANDIN_JIT_S": "3"})
    ssh(host, "rm -rf /var/cache/orchestrator/sglang")
    jit = []
    for _ in range(2):
        done = orchestrator(
            "deploy", "-i", str(lab.inventory), "-p", ref, "--limit", host.name, "--json", "--force-restart"
        )
        assert done.returncode == 0, done.stderr
        (h,) = json.loads(done.stdout)["hosts"]
        jit.append(next((p["s"] for p in h["phases"] if p["phase"] == "jit"), 0.0))
    assert jit[0] > 2.5 and jit[1] < 1.0, jit
    listing = ssh(
        host, "stat -c '%U %n' /var/cache/orchestrator/sglang /var/cache/orchestrator/sglang/deep_gemm/*"
    )
    assert "standin-" in listing and all(line.startswith("root ") for line in listing.splitlines()), listing
    assert service(host)["ActiveState"] == "active"
