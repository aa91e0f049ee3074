"""Preflight on real lab hosts: each rule fails the deploy before anything is stopped."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from labutil import deploy_json, gpu_count, on_good, orchestrator, service, ssh, variant

pytestmark = pytest.mark.lab


@pytest.fixture
def host(lab):
    """lab1 serving the known good profile: every preflight failure must leave it running."""
    return on_good(lab)


def fails_before_the_stop(lab, host, profile_ref: str) -> list[str]:
    """Deploy `profile_ref`; it must fail at preflight, and the running server keep its MainPID."""
    before = service(host)
    rc, report = deploy_json(lab, "--profile", profile_ref, "--limit", host.name)
    assert rc == 1, report
    (h,) = report["hosts"]
    assert h["step"] == "preflight", h
    assert "nothing was stopped" in h["diagnosis"]
    assert not h["restarted"] and not h["rolled_back_to"]
    assert service(host) == before
    return h["problems"]


@contextmanager
def sglang_version(host, version: str):
    ssh(host, "python3", "-m", "sglang._set_version", version)
    try:
        yield
    finally:
        ssh(host, "python3", "-m", "sglang._set_version", "0.5.9")


def test_wrong_sglang_version_on_the_host(lab, host):
    with sglang_version(host, "0.5.23"):
        problems = fails_before_the_stop(lab, host, "cg_2step")
    assert any(
        p.startswith("SGLang 0.5.23 is installed, the profile renders flags for 0.5.9") for p in problems
    )


def test_flag_missing_from_the_hosts_help(lab, host, tmp_path):
    ref = variant(tmp_path, "graph_bs", server={"cuda_graph_max_bs": 16})
    with sglang_version(host, "0.5.23"):
        problems = fails_before_the_stop(lab, host, ref)
    assert (
        "flag --cuda-graph-max-bs is not in this host's `sglang.launch_server --help` (SGLang 0.5.23)"
        in problems
    )


def test_missing_model_path(lab, host, tmp_path):
    problems = fails_before_the_stop(
        lab, host, variant(tmp_path, "nomodel", server={"model_path": "/data/nope"})
    )
    assert problems == ["model path: /data/nope does not exist"]


def test_eagle_with_an_eagle3_drafter(lab, host, tmp_path):
    ref = variant(tmp_path, "eagle1_algo", speculative={"algorithm": "EAGLE"})
    (problem,) = fails_before_the_stop(lab, host, ref)
    assert "is an EAGLE-3 model (LlamaForCausalLMEagle3) but the algorithm is EAGLE" in problem
    assert "silently run with accept length 1.0" in problem


def test_eagle3_with_an_eagle1_drafter(lab, host, tmp_path):
    ref = variant(tmp_path, "eagle3_old", speculative={"draft_model_path": "/data/eagle/llama-eagle"})
    (problem,) = fails_before_the_stop(lab, host, ref)
    assert "is not an EAGLE-3 model (LlamaForCausalLMEagle) but the algorithm is EAGLE3" in problem


def test_tp8_on_a_4_gpu_host(lab, host):
    with gpu_count(host, 4):
        problems = fails_before_the_stop(lab, host, "cg_2step")
    assert (
        "the server uses GPU 0-7 (8: TP x DP, on server.gpus); GPUs 4-7 are not on this host: "
        "nvidia-smi reports 4 GPUs (0-3)" in problems
    )


def test_port_taken_by_a_foreign_process(lab, host, tmp_path):
    ref = variant(tmp_path, "port", server={"port": 30011})
    ssh(host, "systemd-run", "--unit=squatter2", "python3", "-m", "http.server", "30011")
    try:
        pid = ssh(host, "systemctl", "show", "squatter2.service", "--property=MainPID", "--value").strip()
        problems = fails_before_the_stop(lab, host, ref)
    finally:
        ssh(host, "systemctl", "stop", "squatter2.service")
    assert f"port 30011 is taken by PID {pid} /usr/bin/python3 (not sglang.service)" in problems


def test_port_held_by_our_own_unit_is_fine_and_the_command_reports_ok(lab, host):
    done = orchestrator("preflight", "-i", str(lab.inventory), "--limit", host.name, "--profile", "cg_2step")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{host.name}: ok (SGLang 0.5.9, 8 GPUs" in done.stdout


def test_preflight_command_lists_every_problem(lab, host, tmp_path):
    ref = variant(tmp_path, "two", server={"model_path": "/data/nope", "port": 22})
    done = orchestrator("preflight", "-i", str(lab.inventory), "--limit", host.name, "--profile", ref)
    assert done.returncode == 1
    lines = [line for line in done.stdout.splitlines() if line.startswith(f"{host.name}: ")]
    assert f"{host.name}: model path: /data/nope does not exist" in lines
    assert any("port 22 is taken by PID" in line and "sshd" in line for line in lines), lines
