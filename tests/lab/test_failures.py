"""Each failure class provoked for real on a lab host: the diagnosis, how fast it is found, and
that rollback brings back a healthy server running the last good argv."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from labutil import GOOD, cmdline, deploy_json, on_good, service, service_pid, ssh, variant
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

pytestmark = pytest.mark.lab

#: One row per fault for the table printed after the module: fault, detected in s, diagnosis,
#: rolled back. Each test asserts its own row; the table only shows the numbers side by side.
SUMMARY: list[tuple[str, float, str, str]] = []


@pytest.fixture(scope="module", autouse=True)
def fault_table(request):
    """After the last test: what was provoked, how fast it was found, the diagnosis, the rollback."""
    yield
    if not SUMMARY:
        return
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print("\n\nfault                 detected   diagnosis / rollback")
        for fault, took, diagnosis, rolled in SUMMARY:
            print(f"{fault:<21} {took:6.1f} s   {diagnosis[:90]}")
            print(f"{'':<31}rolled back: {rolled}")


@pytest.fixture
def host(lab):
    """lab1, running the known good profile before each fault."""
    return on_good(lab)


def provoke(lab, host, fault: str, profile_ref: str, *args: str) -> tuple[dict, float]:
    """Deploy a broken profile past preflight (which would catch most of these before the stop):
    the point here is how a start that really fails is found, diagnosed and rolled back."""
    start = time.monotonic()
    rc, report = deploy_json(lab, "--profile", profile_ref, "--limit", host.name, "--no-preflight", *args)
    took = time.monotonic() - start
    assert rc == 1, report
    (h,) = report["hosts"]
    # Detected in: the host's own time in the failed play, before any rollback.
    SUMMARY.append((fault, h["elapsed_s"], h["diagnosis"], h["rolled_back_to"] or h["rollback_error"] or "-"))
    return h, took


def assert_rolled_back(h: dict, host) -> None:
    good = launch.build(profile_mod.load(GOOD))
    assert h["rolled_back_to"] == f"{GOOD} ({good.digest})", h
    state = service(host)
    assert state["ActiveState"] == "active"
    assert cmdline(host, state["MainPID"]) == good.argv


def test_bad_flag(lab, host, tmp_path):
    # A 0.5.23 profile on a 0.5.9 host: --cuda-graph-max-bs-decode is not a 0.5.9 flag.
    ref = variant(tmp_path, "newer_flags", server={"sglang_version": "0.5.23", "cuda_graph_max_bs": 16})
    h, took = provoke(lab, host, "bad flag", ref)
    assert h["diagnosis"].startswith("unknown or wrong flag"), h["diagnosis"]
    assert "--cuda-graph-max-bs-decode" in h["diagnosis"] or "--tp-size" in h["diagnosis"]
    assert h["step"] == "health" and took < 30
    assert_rolled_back(h, host)


def test_missing_model_path(lab, host, tmp_path):
    h, took = provoke(
        lab, host, "missing model path", variant(tmp_path, "nomodel", server={"model_path": "/data/x"})
    )
    assert h["diagnosis"].startswith("model or draft model path missing"), h["diagnosis"]
    assert "/data/x" in h["diagnosis"] and took < 30
    assert_rolled_back(h, host)


def test_cuda_oom_from_mem_fraction(lab, host, tmp_path):
    h, took = provoke(lab, host, "CUDA OOM", variant(tmp_path, "oom", server={"mem_fraction_static": 0.97}))
    assert h["diagnosis"].startswith("CUDA out of memory"), h["diagnosis"]
    assert took < 30
    assert_rolled_back(h, host)


def test_port_taken_by_another_process(lab, host, tmp_path):
    ref = variant(tmp_path, "port", server={"port": 30007})
    ssh(host, "systemd-run", "--unit=squatter", "python3", "-m", "http.server", "30007")
    try:
        h, took = provoke(lab, host, "port in use", ref)
    finally:
        ssh(host, "systemctl", "stop", "squatter.service")
    assert h["diagnosis"].startswith("port already in use"), h["diagnosis"]
    assert took < 30
    assert_rolled_back(h, host)


def test_server_killed_mid_start(lab, host, tmp_path):
    ref = variant(tmp_path, "slow", env={"SGLANG_STANDIN_LOAD_DELAY_S": "8"})
    result: dict = {}

    def kill_when_started() -> None:
        pid = service_pid(host, "sglang.service", timeout_s=30, not_pid=service(host)["MainPID"])
        time.sleep(1)
        ssh(host, "kill", "-9", pid)
        result["killed_at"] = time.monotonic()

    killer = threading.Thread(target=kill_when_started)
    killer.start()
    h, _ = provoke(lab, host, "killed mid-start", ref)
    killer.join()
    assert h["diagnosis"].startswith("killed by a signal"), h["diagnosis"]
    assert "signal 9" in h["diagnosis"]
    assert_rolled_back(h, host)


def test_ctrl_c_mid_start_rolls_back_and_leaves_no_lock(lab, host, tmp_path):
    ref = variant(tmp_path, "slow", env={"SGLANG_STANDIN_LOAD_DELAY_S": "8"})
    old_pid = service(host)["MainPID"]
    argv = [sys.executable, "-m", "orchestrator", "deploy", "-i", str(lab.inventory)]
    proc = subprocess.Popen(
        [*argv, "--limit", host.name, "--profile", ref, "--json"], stdout=subprocess.PIPE, text=True
    )
    service_pid(host, "sglang.service", timeout_s=60, not_pid=old_pid)  # the new server is loading
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    report = json.loads(out)
    (h,) = report["hosts"]
    # The start is one transaction on the host (roles/sglang_restart) for its first 5 s of health.
    assert report["interrupted"] and h["diagnosis"] == "interrupted (Ctrl-C) during restart", h
    assert_rolled_back(h, host)
    assert ssh(host, "ls", "-A", "/run/orchestrator") == ""  # the lock went with the rollback
    # The interrupted transaction started no later step behind the rollback's back: past the time
    # its server would have needed, the rolled-back one still runs, and is the one recorded.
    running = service(host)["MainPID"]
    time.sleep(10)
    assert service(host)["MainPID"] == running
    good = launch.build(profile_mod.load(GOOD))
    record = json.loads(ssh(host, "cat", f"{launch.HOST_STATE_DIR}/last-good/sglang.service.json"))
    assert record["digest"] == good.digest


def test_never_healthy_fails_at_the_timeout(lab, host, tmp_path):
    ref = variant(tmp_path, "hang", env={"SGLANG_STANDIN_HANG": "1"}, service={"health_timeout_s": 6})
    h, took = provoke(lab, host, "never healthy", ref)
    assert h["diagnosis"].startswith("alive but never healthy before the timeout"), h["diagnosis"]
    assert 6 <= took < 40
    assert_rolled_back(h, host)


def test_foreign_gpu_process_fails_before_the_stop(lab, host):
    before = service(host)
    ssh(
        host, "systemd-run", "--unit=foreign-holder", "/usr/local/bin/gpu-hold", "--gpu", "0", "--mib", "2000"
    )
    try:
        pid = service_pid(host, "foreign-holder.service")
        start = time.monotonic()
        rc, report = deploy_json(lab, "--profile", "cg_2step", "--limit", host.name)
        took = time.monotonic() - start
        assert rc == 1, report
        (h,) = report["hosts"]
        SUMMARY.append(("foreign GPU process", h["elapsed_s"], h["diagnosis"], "- (nothing was stopped)"))
    finally:
        ssh(host, "systemctl", "stop", "foreign-holder.service")
    assert f"GPU 0 is used by PID {pid} /usr/bin/python3 2000 MiB, outside sglang.service" in h["diagnosis"]
    assert h["step"] == "preflight" and took < 30
    assert service(host) == before  # never stopped, so nothing to roll back
    assert not h["rolled_back_to"] and not h["stopped"]


def test_kill_gpu_holders_kills_exactly_the_holder(lab, host):
    ssh(
        host,
        "systemd-run",
        "--unit=foreign-holder2",
        "/usr/local/bin/gpu-hold",
        "--gpu",
        "1",
        "--mib",
        "1000",
    )
    pid = service_pid(host, "foreign-holder2.service")
    rc, report = deploy_json(lab, "--profile", "cg_2step", "--limit", host.name, "--kill-gpu-holders")
    assert rc == 0, report
    (h,) = report["hosts"]
    assert [k["pid"] for k in h["killed"]] == [int(pid)]
    assert (
        ssh(host, "systemctl", "show", "foreign-holder2.service", "--property=MainPID", "--value").strip()
        == "0"
    )


def test_unreachable_host_is_reported_and_others_carry_on(lab, tmp_path):
    inv = yaml.safe_load(Path(lab.inventory).read_text())
    hosts = inv["all"]["children"]["lab"]["hosts"]
    ghost = dict(hosts[lab.hosts[1].name], ansible_host="10.213.0.99")
    hosts["ghost"] = ghost
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    done = subprocess.run(
        [
            "python3",
            "-m",
            "orchestrator",
            "deploy",
            "-i",
            str(path),
            "--limit",
            f"ghost,{lab.hosts[1].name}",
            "--profile",
            GOOD,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    import json

    report = json.loads(done.stdout)
    assert done.returncode == 1
    by_host = {h["host"]: h for h in report["hosts"]}
    assert by_host[lab.hosts[1].name]["ok"], by_host[lab.hosts[1].name]
    assert not by_host["ghost"]["ok"] and by_host["ghost"]["step"] == "connect"
    assert (
        "unreachable" in by_host["ghost"]["diagnosis"].lower()
        or "ssh" in by_host["ghost"]["diagnosis"].lower()
    )
    ghost = by_host["ghost"]
    SUMMARY.append(("unreachable host", ghost["elapsed_s"], ghost["diagnosis"][:80], "-"))


def test_concurrent_deploys_never_interleave(lab, host, tmp_path):
    slow = variant(tmp_path, "slow_good", env={"SGLANG_STANDIN_LOAD_DELAY_S": "4"})
    results: dict[str, tuple[int, dict]] = {}

    def run(name: str, ref: str, *args: str) -> None:
        results[name] = deploy_json(lab, "--profile", ref, "--limit", host.name, *args)

    old_pid = service(host)["MainPID"]
    first = threading.Thread(target=run, args=("first", slow))
    first.start()
    # Its new server has started: the first deploy holds the lock (it is loading for 4 s).
    service_pid(host, "sglang.service", timeout_s=60, not_pid=old_pid)
    run("second", "cg_2step", "--lock-wait", "1")
    first.join()
    rc1, r1 = results["first"]
    rc2, r2 = results["second"]
    assert rc1 == 0, r1
    assert rc2 == 1
    msg = r2["hosts"][0]["diagnosis"]
    assert "another deploy holds this host" in msg and "deploying slow_good" in msg, msg
    assert r2["hosts"][0]["step"] == "probe" and not r2["hosts"][0]["rolled_back_to"]
    # The second waited and touched nothing: the first's server is the one running.
    assert "# profile: slow_good" in ssh(host, "cat", "/etc/systemd/system/sglang.service")
    SUMMARY.append(("concurrent deploy", r2["hosts"][0]["elapsed_s"], msg[:80], "-"))


def test_max_fail_percent_stops_before_touching_later_hosts(lab, tmp_path):
    names = [h.name for h in lab.hosts]
    rc, _ = deploy_json(lab, "--profile", GOOD)
    assert rc == 0
    before = {h.name: service(h) for h in lab.hosts}
    ref = variant(tmp_path, "nomodel_all", server={"model_path": "/data/none"})
    rc, report = deploy_json(
        lab, "--profile", ref, "--serial", "1", "--max-fail-percent", "0", "--no-preflight"
    )
    assert rc == 1
    by_host = {h["host"]: h for h in report["hosts"]}
    assert sorted(by_host) == sorted(names)
    first, *rest = names
    assert by_host[first]["step"] == "health" and by_host[first]["rolled_back_to"].startswith(GOOD)
    for name in rest:
        assert by_host[name]["step"] == "not started", by_host[name]
        assert "not touched" in by_host[name]["diagnosis"]
    for h in lab.hosts[1:]:
        assert service(h) == before[h.name]


def test_api_key_never_leaks(lab, host, tmp_path):
    import json
    import os
    import secrets
    import urllib.request

    from orchestrator import ledger
    from orchestrator.paths import state_dir

    key = "sk-orch-" + secrets.token_hex(12)
    ref = variant(tmp_path, "with_key", api_key={"env": "ORCH_TEST_API_KEY"})
    env = {**os.environ, "ORCH_TEST_API_KEY": key}

    def deploy(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = ["python3", "-m", "orchestrator", "deploy", "-i", str(lab.inventory), "--limit", host.name]
        return subprocess.run(
            [*argv, "-p", ref, *extra], capture_output=True, text=True, timeout=300, env=env
        )

    # The process list of the control machine while a deploy runs (every argv, sampled).
    seen_argv: set[str] = set()
    running = subprocess.Popen(
        [
            "python3",
            "-m",
            "orchestrator",
            "deploy",
            "-i",
            str(lab.inventory),
            "--limit",
            host.name,
            "-p",
            ref,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    while running.poll() is None:
        seen_argv |= set(
            subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True).stdout.splitlines()
        )
        time.sleep(0.05)
    out, errs = running.communicate()
    done = subprocess.CompletedProcess(running.args, running.returncode, out, errs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert any("ansible-playbook" in a for a in seen_argv), "the sampling never saw the play"
    report = json.loads(deploy("--json").stdout)
    # The server got the key: unauthenticated generation is refused, the key is accepted.
    url = f"http://{host.address}:30000/v1/models"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 401
    authed = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    assert urllib.request.urlopen(authed, timeout=5).status == 200
    # Only in the root-only --config file.
    mode = ssh(host, "stat -c '%a %U %G' /etc/orchestrator/sglang.config.yaml").split()
    assert mode == ["600", "root", "root"]
    assert key in ssh(host, "cat", "/etc/orchestrator/sglang.config.yaml")
    pid = service(host)["MainPID"]
    places = {
        "unit file": ssh(host, "cat", "/etc/systemd/system/sglang.service"),
        "server cmdline": " ".join(cmdline(host, pid)),
        "deploy output": done.stdout + done.stderr + json.dumps(report),
        "ledger": ledger.path().read_bytes().decode(errors="replace"),
    }
    places["control machine process list"] = "\n".join(seen_argv)
    # Every file of the state directory: runs, artifacts, vars, ledger, caches; not the lab's own
    # host file systems (the host holds the key, in its --config file, by design).
    for folder, subdirs, files in os.walk(state_dir()):
        if Path(folder) == state_dir() / "lab":
            subdirs.remove("hosts")
        for name in files:
            path = Path(folder, name)
            if path.is_file():
                places[str(path)] = path.read_bytes().decode(errors="replace")
    assert len(places) > 20
    assert not list(Path("/dev/shm").glob("orchestrator-secret-*")), "the play's secret file was left behind"
    leaks = [where for where, text in places.items() if key in text]
    assert not leaks, f"API key found in: {leaks}"
