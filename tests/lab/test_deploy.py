"""deploy on real systemd hosts over SSH: idempotence, restart order, check mode, failures, quoting."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

from labutil import UNIT, cmdline, deploy_json, orchestrator, service, service_pid, ssh, write_profile
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

pytestmark = pytest.mark.lab


@pytest.fixture
def first(lab):
    return lab.hosts[0]


def test_deploy_then_noop_changes_nothing(lab):
    rc, report = deploy_json(lab, "--profile", "cg_5tok")
    assert rc == 0, report
    digest = launch.build(profile_mod.load("cg_5tok")).digest
    assert [h["host"] for h in report["hosts"]] == [h.name for h in lab.hosts]
    for h in report["hosts"]:
        assert h["ok"] and h["digest"] == digest and h["healthy_after_s"] is not None
    before = {h.name: service(h) for h in lab.hosts}
    assert all(s["ActiveState"] == "active" for s in before.values())

    rc, again = deploy_json(lab, "--profile", "cg_5tok")
    assert rc == 0, again
    for h in again["hosts"]:
        assert h["ok"] and not h["changed"] and not h["restarted"], h
    assert {h.name: service(h) for h in lab.hosts} == before  # same MainPID and start time


def test_server_gets_the_plans_argv_byte_for_byte(lab, first, tmp_path):
    nasty = write_profile(
        tmp_path,
        "nasty",
        "extends: cg_5tok\nserver:\n  served_model_name: 'kimi \"k2\" $HOME 100% \\\\ %n ${USER} ;'\n",
    )
    rc, report = deploy_json(lab, "--profile", nasty, "--limit", first.name)
    assert rc == 0, report
    expected = launch.build(profile_mod.load(nasty)).argv
    assert cmdline(first, service(first)["MainPID"]) == expected


def test_profile_switch_restarts_with_new_flags(lab, first):
    deploy_json(lab, "--profile", "cg_5tok", "--limit", first.name)
    old_pid = service(first)["MainPID"]
    rc, report = deploy_json(lab, "--profile", "cg_2step", "--limit", first.name)
    assert rc == 0, report
    (h,) = report["hosts"]
    assert h["restarted"] and h["changed"]
    assert any("unit differs" in r for r in h["reasons"])
    new = service(first)
    assert new["MainPID"] != old_pid and new["ActiveState"] == "active"
    argv = cmdline(first, new["MainPID"])
    assert argv[argv.index("--speculative-num-steps") + 1] == "2"
    assert "# profile: cg_2step" in ssh(first, "cat", UNIT)


def test_stopped_service_with_same_unit_is_started_again(lab, first):
    deploy_json(lab, "--profile", "cg_5tok", "--limit", first.name)
    ssh(first, "systemctl", "stop", "sglang.service")
    rc, report = deploy_json(lab, "--profile", "cg_5tok", "--limit", first.name)
    assert rc == 0, report
    (h,) = report["hosts"]
    assert h["restarted"] and "service is inactive" in h["reasons"]
    assert service(first)["ActiveState"] == "active"


def test_force_restart_restarts_an_unchanged_healthy_server(lab, first):
    deploy_json(lab, "--profile", "cg_5tok", "--limit", first.name)
    old = service(first)["MainPID"]
    rc, report = deploy_json(lab, "--profile", "cg_5tok", "--limit", first.name, "--force-restart")
    assert rc == 0 and report["hosts"][0]["restarted"]
    assert service(first)["MainPID"] != old


def test_check_mode_shows_the_change_and_changes_nothing(lab, first):
    deploy_json(lab, "--profile", "cg_5tok", "--limit", first.name)
    before, unit_before = service(first), ssh(first, "cat", UNIT)
    done = orchestrator(
        "deploy", "-i", str(lab.inventory), "--limit", first.name, "--profile", "cg_16tok", "--check"
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "restart: yes" in text and "unit differs" in text
    assert "--speculative-num-steps: 3 -> 5" in text
    assert "--speculative-num-draft-tokens: 5 -> 16" in text
    assert (
        "-    --speculative-num-draft-tokens 5" in text and "+    --speculative-num-draft-tokens 16" in text
    )
    assert "GPUs: busy (GPU 0,1,2,3,4,5,6,7: PID " in text
    assert service(first) == before and ssh(first, "cat", UNIT) == unit_before


def test_invalid_profile_exits_2_before_touching_hosts(lab, first, tmp_path):
    deploy_json(lab, "--profile", "cg_5tok", "--limit", first.name)
    before = service(first)
    bad = write_profile(
        tmp_path, "bad", "extends: cg_5tok\nspeculative: {algorithm: EAGLE3, draft_model_path: null}\n"
    )
    done = orchestrator("deploy", "-i", str(lab.inventory), "--profile", bad)
    assert done.returncode == 2
    assert "speculative.draft_model_path: algorithm EAGLE3 needs a draft model" in done.stderr
    assert service(first) == before


def test_server_that_dies_fails_fast_with_its_journal(lab, first, tmp_path):
    broken = write_profile(
        tmp_path,
        "broken",
        "extends: cg_5tok\nserver: {model_path: /data/models/missing}\nservice: {health_timeout_s: 300}\n",
    )
    start = time.monotonic()
    # past preflight (which would refuse the missing path before the stop): this is about the start
    rc, report = deploy_json(lab, "--profile", broken, "--limit", first.name, "--no-preflight")
    took = time.monotonic() - start
    assert rc == 1
    (h,) = report["hosts"]
    assert not h["ok"] and h["step"] == "health"
    assert "exited" in h["message"]
    assert any("/data/models/missing" in line for line in h["journal"]), h["journal"]
    assert took < 120, f"waited {took:.0f} s: should fail as soon as the server exits, not at the timeout"


def test_busy_gpu_fails_naming_the_holder_before_stopping_anything(lab, first):
    deploy_json(lab, "--profile", "cg_5tok", "--limit", first.name)
    before = service(first)
    ssh(
        first,
        "systemd-run",
        "--unit=foreign-gpu-hold",
        "/usr/local/bin/gpu-hold",
        "--gpu",
        "3",
        "--mib",
        "4000",
    )
    try:
        pid = service_pid(first, "foreign-gpu-hold.service")
        rc, report = deploy_json(lab, "--profile", "cg_2step", "--limit", first.name)
    finally:
        ssh(first, "systemctl", "stop", "foreign-gpu-hold.service")
    assert rc == 1
    (h,) = report["hosts"]
    assert h["step"] == "preflight"
    # nvidia-smi names a process by its argv[0]: gpu-hold is a python3 script
    assert f"GPU 3 is used by PID {pid} /usr/bin/python3 4000 MiB, outside sglang.service" in h["message"]
    assert service(first) == before  # the running server was not stopped


def test_status_and_stop(lab, first):
    deploy_json(lab, "--profile", "cg_5tok", "--limit", first.name)
    done = orchestrator("status", "-i", str(lab.inventory), "--limit", first.name, "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["profile"] == "cg_5tok" and row["active_state"] == "active" and row["health"] == 200
    assert row["gpu_used_mib"] > 0 and row["main_pid"] > 0
    done = orchestrator("stop", "-i", str(lab.inventory), "--limit", first.name)
    assert done.returncode == 0, done.stderr
    assert "GPUs released" in done.stdout
    assert service(first)["ActiveState"] in ("inactive", "failed")


def verify(lab, *args: str) -> subprocess.CompletedProcess[str]:
    return orchestrator("verify", "-i", str(lab.inventory), *args)


def test_verify_passes_after_deploy_and_names_drift_that_deploy_repairs(lab):
    two = [h.name for h in lab.hosts[:2]]
    limit = ",".join(two)
    rc, _ = deploy_json(lab, "--profile", "cg_5tok", "--limit", limit)
    assert rc == 0
    done = verify(lab, "--profile", "cg_5tok", "--limit", limit)
    assert done.returncode == 0, done.stdout
    assert done.stdout.count("pass") == 10 and "FAIL" not in done.stdout

    rc, report = deploy_json(lab, "--profile", "cg_2step", "--limit", limit)
    assert rc == 0 and all(h["restarted"] for h in report["hosts"])
    done = verify(lab, "--limit", limit)  # profile taken from what the hosts run
    assert done.returncode == 0 and "verify cg_2step" in done.stdout, done.stdout

    second = lab.hosts[1]
    ssh(second, "sed", "-i", "s/NCCL_PROTO=LL/NCCL_PROTO=Simple/", UNIT)
    done = verify(lab, "--profile", "cg_2step", "--limit", limit, "--json")
    assert done.returncode == 1
    failed = [c for c in json.loads(done.stdout)["checks"] if not c["passed"]]
    assert [(c["host"], c["check"]) for c in failed] == [(second.name, "unit file equals the plan")]
    assert '+Environment="NCCL_PROTO=Simple"' in failed[0]["message"]

    rc, report = deploy_json(lab, "--profile", "cg_2step", "--limit", limit)
    assert rc == 0
    by_host = {h["host"]: h for h in report["hosts"]}
    assert by_host[second.name]["restarted"] and not by_host[two[0]]["restarted"]
    assert verify(lab, "--profile", "cg_2step", "--limit", limit).returncode == 0


def test_rollback_goes_back_one_healthy_unit_or_to_a_named_profile(lab, first):
    def rollback(*args: str) -> tuple[int, dict]:
        done = orchestrator("rollback", "-i", str(lab.inventory), "--limit", first.name, "--json", *args)
        return done.returncode, json.loads(done.stdout)

    for ref in ("cg_5tok", "cg_2step"):
        rc, report = deploy_json(lab, "--profile", ref, "--limit", first.name)
        assert rc == 0, report
    rc, report = rollback()
    assert rc == 0, report
    (h,) = report["hosts"]
    digest = launch.build(profile_mod.load("cg_5tok")).digest
    assert h["rolled_back_to"] == f"cg_5tok ({digest})" and h["restarted"] and h["digest"] == digest, h
    assert "# profile: cg_5tok" in ssh(first, "cat", UNIT)
    assert service(first)["ActiveState"] == "active"

    rc, report = rollback("--to", "cg_2step")
    assert rc == 0, report
    assert report["hosts"][0]["rolled_back_to"].startswith("cg_2step (")
    assert "# profile: cg_2step" in ssh(first, "cat", UNIT)

    never = f"never_deployed_{uuid.uuid4().hex[:8]}"
    rc, report = rollback("--to", never)  # nothing healthy to go to: nothing is touched
    assert rc == 1
    assert report["hosts"][0]["rollback_error"] == f"no healthy {never} unit recorded for this host"
    assert "# profile: cg_2step" in ssh(first, "cat", UNIT)
