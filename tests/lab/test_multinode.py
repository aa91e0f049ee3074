"""A multi-node SGLang server (one server over two lab hosts) restarted and failed as one."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
import yaml

from labutil import cmdline, deploy_json, gpu_count, orchestrator, service, service_pid, ssh, write_profile
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

pytestmark = pytest.mark.lab

PROFILE = "cg_5tok_2node"


@pytest.fixture
def ranks(lab):
    if len(lab.hosts) < 3:
        pytest.skip("needs 3 lab hosts (ranks on the 2nd and 3rd)")
    return list(lab.hosts[1:3])


def limit(ranks) -> str:
    return ",".join(h.name for h in ranks)


def health(host) -> int | str:
    try:
        return urllib.request.urlopen(f"http://{host.address}:30000/health", timeout=3).status
    except urllib.error.URLError as exc:
        return str(exc.reason)


def test_two_node_server_has_its_ranks_and_one_http_endpoint(lab, ranks):
    rc, report = deploy_json(lab, "--profile", PROFILE, "--limit", limit(ranks))
    assert rc == 0, report
    for rank, host in enumerate(ranks):
        argv = cmdline(host, service(host)["MainPID"])
        flags = launch.flags_of(argv)
        assert flags["--nnodes"] == "2" and flags["--node-rank"] == str(rank)
        assert flags["--dist-init-addr"] == f"{ranks[0].address}:5757"
    assert health(ranks[0]) == 200
    assert "refused" in str(health(ranks[1])).lower()  # only node rank 0 serves HTTP
    done = orchestrator("status", "-i", str(lab.inventory), "--limit", limit(ranks), "--json")
    assert [r["health"] for r in json.loads(done.stdout)] == [200, 200]  # rank 1 reports rank 0's
    done = orchestrator("verify", "-i", str(lab.inventory), "--limit", limit(ranks), "-p", PROFILE)
    assert done.returncode == 0 and done.stdout.count("pass") == 10, done.stdout  # each rank's own plan
    rc, again = deploy_json(lab, "--profile", PROFILE, "--limit", limit(ranks))
    assert rc == 0 and not any(h["restarted"] for h in again["hosts"])


def test_killing_rank_1_mid_start_fails_the_group_and_rolls_it_back(lab, ranks, tmp_path):
    rc, _ = deploy_json(lab, "--profile", PROFILE, "--limit", limit(ranks))
    assert rc == 0
    good = {h.name: cmdline(h, service(h)["MainPID"]) for h in ranks}
    slow = write_profile(
        tmp_path,
        "slow_2node",
        yaml.safe_dump({"extends": PROFILE, "env": {"SGLANG_STANDIN_LOAD_DELAY_S": "6"}}),
    )
    old_pid = service(ranks[1])["MainPID"]

    def kill_rank_1() -> None:
        pid = service_pid(ranks[1], "sglang.service", timeout_s=60, not_pid=old_pid)
        time.sleep(1.5)
        ssh(ranks[1], "kill", "-9", pid)

    killer = threading.Thread(target=kill_rank_1)
    killer.start()
    rc, report = deploy_json(lab, "--profile", slow, "--limit", limit(ranks))
    killer.join()
    assert rc == 1
    by_host = {h["host"]: h for h in report["hosts"]}
    for h in ranks:
        diagnosis = by_host[h.name]["diagnosis"]
        assert diagnosis.startswith(
            f"group failed: node rank 1 ({ranks[1].name}) failed first: killed by a signal"
        )
        assert by_host[h.name]["rolled_back_to"].startswith(PROFILE), by_host[h.name]
    for h in ranks:
        assert cmdline(h, service(h)["MainPID"]) == good[h.name]
    assert health(ranks[0]) == 200


def test_a_profile_rank_count_that_does_not_split_the_gpus_is_bad_input(lab, ranks):
    from labutil import orchestrator

    done = orchestrator(
        "deploy",
        "-i",
        str(lab.inventory),
        "--profile",
        PROFILE,
        "--limit",
        ",".join(h.name for h in lab.hosts[:3]),
    )
    assert done.returncode == 2
    assert "split its 8 GPUs evenly" in done.stderr


def test_the_shipped_two_node_profile_is_valid():
    assert profile_mod.load(PROFILE).deployment.kind == "multinode"


def test_preflight_checks_each_rank_for_its_share_of_the_gpus(lab, ranks):
    preflight = ("preflight", "-i", str(lab.inventory), "--limit")
    with gpu_count(ranks[0], 4), gpu_count(ranks[1], 4):
        two_nodes = orchestrator(*preflight, limit(ranks), "-p", PROFILE)
        one_node = orchestrator(*preflight, ranks[1].name, "-p", "cg_5tok")
    assert two_nodes.returncode == 0, two_nodes.stdout + two_nodes.stderr  # TP 8 over 2 x 4 GPUs
    assert one_node.returncode == 1
    assert (
        "the server uses GPU 0-7 (8: TP x DP, on server.gpus); GPUs 4-7 are not on this host: "
        "nvidia-smi reports 4 GPUs (0-3)" in one_node.stdout + one_node.stderr
    )


def changed(tmp_path, name: str) -> str:
    """PROFILE with one setting changed: a deploy of it restarts every rank."""
    return write_profile(tmp_path, name, yaml.safe_dump({"extends": PROFILE, "env": {"ORCH_TRY": name}}))


def test_a_rank_failing_its_preflight_leaves_every_rank_untouched(lab, ranks, tmp_path):
    """Rank 1 refuses at its preflight (a foreign process on its GPU 0): rank 0 passed its own, but
    is stopped neither, since a rank restarted alone cannot join peers on the old unit; both locks
    are released."""
    rc, _ = deploy_json(lab, "--profile", PROFILE, "--limit", limit(ranks))
    assert rc == 0
    before = {h.name: service(h)["MainPID"] for h in ranks}
    ssh(
        ranks[1], "systemd-run", "--unit=rank-holder", "/usr/local/bin/gpu-hold", "--gpu", "0", "--mib", "900"
    )
    try:
        pid = service_pid(ranks[1], "rank-holder.service")
        rc, report = deploy_json(lab, "--profile", changed(tmp_path, "try_a"), "--limit", limit(ranks))
    finally:
        ssh(ranks[1], "systemctl", "stop", "rank-holder.service")
    assert rc == 1, report
    by_host = {h["host"]: h for h in report["hosts"]}
    for h in ranks:
        assert by_host[h.name]["diagnosis"].startswith(
            f"group failed: node rank 1 ({ranks[1].name}) failed first: preflight: 1 problem(s), "
            f"nothing was stopped: GPU 0 is used by PID {pid}"
        ), by_host[h.name]
        assert not by_host[h.name]["stopped"] and not by_host[h.name]["rolled_back_to"]
        assert service(h)["MainPID"] == before[h.name]  # still the old server, never stopped
    assert by_host[ranks[0].name]["step"] == "ranks" and by_host[ranks[1].name]["step"] == "preflight"
    assert health(ranks[0]) == 200
    # Neither rank kept its lock: the same deploy goes through once the GPU is free.
    rc, report = deploy_json(lab, "--profile", PROFILE, "--limit", limit(ranks))
    assert rc == 0, report


def test_a_rank_failing_a_step_ends_every_rank_there(lab, ranks, tmp_path):
    """Rank 1's start fails (a drop-in of someone else's whose ExecStartPre= fails): rank 0,
    started in the same task, goes no further (no health wait, no record) and the group fails at
    once, naming rank 1."""
    rc, _ = deploy_json(lab, "--profile", PROFILE, "--limit", limit(ranks))
    assert rc == 0
    dropin = "/run/systemd/system/sglang.service.d"
    ssh(
        ranks[1],
        "sh",
        "-c",
        f"mkdir -p {dropin} && printf '[Service]\\nExecStartPre=/bin/false\\n' > {dropin}/x.conf",
    )
    try:
        start = time.monotonic()
        rc, report = deploy_json(
            lab, "--profile", changed(tmp_path, "try_b"), "--limit", limit(ranks), "--no-rollback"
        )
        took = time.monotonic() - start
    finally:
        ssh(ranks[1], "sh", "-c", f"rm -r {dropin} && systemctl daemon-reload")
    assert rc == 1, report
    by_host = {h["host"]: h for h in report["hosts"]}
    for h in ranks:
        assert by_host[h.name]["diagnosis"].startswith(
            f"group failed: node rank 1 ({ranks[1].name}) failed first: failed at start:"
        ), by_host[h.name]
        assert by_host[h.name]["stopped"]
    assert by_host[ranks[0].name]["step"] == "start"  # not health: it never waited for its peer
    assert took < 30  # rank 0 would wait for rank 1 up to the stand-in's dist_timeout_s (30 s)
    rc, report = deploy_json(lab, "--profile", PROFILE, "--limit", limit(ranks))
    assert rc == 0, report
    assert health(ranks[0]) == 200
