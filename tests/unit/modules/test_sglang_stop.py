"""roles/sglang_stop: stop, wait for the cgroup to empty, then for the GPUs to be released."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import gpus
from hostfakes import Engine, capture, compute_apps, load_module, query_gpu, store_unit, systemctl_show

RUNNING = {"LoadState": "loaded", "ActiveState": "active", "MainPID": "4242", "ControlGroup": "/gone.slice/x"}
STOPPED = {"LoadState": "loaded", "ActiveState": "inactive", "MainPID": "0", "ControlGroup": ""}
KILLED = (capture("killed-query-gpu.csv"), capture("killed-compute-apps.csv"))
RELEASED = (capture("released-query-gpu.csv"), capture("released-compute-apps.csv"))


@pytest.fixture
def stop():
    return load_module("sglang_stop")


def systemctl(before: dict, after: dict):
    stopped = []

    def answer(argv: list[str]) -> tuple[int, str, str]:
        if argv[1] == "stop":
            stopped.append(argv[2])
            return 0, "", ""
        return systemctl_show(**(after if stopped else before))

    return answer


def test_stop_then_wait_for_the_gpus(stop, host, paths, run_module):
    host.answers["systemctl"] = systemctl(RUNNING, STOPPED)
    host.smi = [KILLED, KILLED, RELEASED]
    failed, result = run_module(stop, {"paths": paths, "unit_name": "sglang.service", "gpus": [0]})
    assert not failed, result.get("msg")
    assert (result["changed"], result["was_active"], result["main_pid"]) == (True, True, 4242)
    assert result["stop_s"] >= 0 and ["/usr/bin/systemctl", "stop", "sglang.service"] in host.calls
    assert result["gpus"]["idle"] and result["gpus"]["waited_s"] > 0 and result["gpus"]["killed"] == []


def test_gpus_never_released_fail_with_the_gpu_idle_message(stop, host, paths, run_module):
    host.answers["systemctl"] = systemctl(RUNNING, STOPPED)
    host.smi = [KILLED]
    failed, result = run_module(
        stop, {"paths": paths, "unit_name": "sglang.service", "gpu_release_timeout_s": 0.3}
    )
    assert failed
    assert result["msg"].startswith("GPUs not idle after waiting 0.")
    assert result["msg"].endswith(": GPU 0 has 4623 MiB used by PID 443 [No data] 4614 MiB")
    assert result["was_active"] and not result["gpus"]["idle"]


def test_a_gpu_missing_from_the_host_fails_with_its_gpu_list(stop, host, paths, run_module):
    """wait_idle fails with nvidia-smi's list of GPUs as `gpus`, not the wait's report (RETURN
    says so; orchestrator/hosts/module_results.py StopFailed reads either)."""
    from orchestrator.hosts import readback
    from orchestrator.hosts.runner import TaskEvent

    host.answers["systemctl"] = systemctl(RUNNING, STOPPED)
    host.smi = [RELEASED]
    failed, result = run_module(stop, {"paths": paths, "unit_name": "sglang.service", "gpus": [7]})
    assert failed and "GPU 7 is not on this host" in result["msg"]
    assert isinstance(result["gpus"], list) and result["gpus"][0]["index"] == 0
    assert readback.step_of(TaskEvent("h", "failed", "", "sglang_stop", result)) == "stop"


def test_a_unit_that_does_not_exist_is_already_stopped(stop, host, paths, run_module):
    host.answers["systemctl"] = systemctl(
        {"LoadState": "not-found", "ActiveState": "inactive", "MainPID": "0"}, {}
    )
    host.smi = [RELEASED]
    failed, result = run_module(stop, {"paths": paths, "unit_name": "sglang.service"})
    assert not failed and result["changed"] is False and result["stop_s"] == 0.0
    assert host.ran("systemctl") == [host.calls[0]]  # only the show


def test_check_mode_stops_nothing_and_reports_busy_gpus(stop, host, paths, run_module):
    host.answers["systemctl"] = systemctl(RUNNING, STOPPED)
    host.smi = [KILLED]
    failed, result = run_module(stop, {"paths": paths, "unit_name": "sglang.service"}, check_mode=True)
    assert not failed and result["changed"] and not result["gpus"]["idle"]
    assert all(call[1] == "show" for call in host.ran("systemctl"))


def test_processes_left_after_the_stop_fail_it(stop, host, paths, run_module):
    host.answers["systemctl"] = systemctl(RUNNING, {**RUNNING, "ActiveState": "deactivating"})
    failed, result = run_module(stop, {"paths": paths, "unit_name": "sglang.service", "gone_timeout_s": 0.2})
    assert failed and result["msg"] == "sglang.service still has processes ['4242'] after stop"


# --- several servers on one host: ours, sglang-b.service, on GPUs 4-7; sglang-a.service on 0-3 ----


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen]]:
    """Two processes nvidia-smi will be made to list as GPU holders, reaped as soon as they die."""
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    for proc in procs:
        threading.Thread(target=proc.wait, daemon=True).start()
    yield procs
    for proc in procs:
        proc.kill()


def test_the_stop_waits_for_the_units_own_gpus_only(stop, host, paths, run_module):
    """`orchestrator stop --unit sglang-b.service` passes no GPUs: the unit's stored ones count,
    and sglang-a.service's memory on GPUs 0-3 does not keep it waiting."""
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=30000, gpus=[0, 1, 2, 3])
    store_unit(paths, "sglang-b.service", profile="cg_2step", port=30001, gpus=[4, 5, 6, 7])
    host.answers["systemctl"] = systemctl(RUNNING, STOPPED)
    apps = compute_apps(*((100 + i, "python3", 70000, i) for i in range(4)))
    host.smi = [(query_gpu(8, {i: 70000 for i in range(4)}), apps)]
    failed, result = run_module(
        stop, {"paths": paths, "unit_name": "sglang-b.service", "gpu_release_timeout_s": 0}
    )
    assert not failed, result["msg"]
    assert result["gpus"]["idle"] and result["gpus"]["checked"] == [4, 5, 6, 7]
    assert result["gpus"]["holders"] == []


def test_kill_gpu_holders_kills_a_foreign_holder_never_a_neighbours_process(
    stop, host, paths, run_module, cgroups, sleepers, monkeypatch
):
    monkeypatch.setattr(gpus, "KILLED_RELEASE_S", 0.3)
    neighbour, foreign = sleepers
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=30000, gpus=[0, 1, 2, 3])
    cgroups[neighbour.pid] = "sglang-a.service"  # sglang-a.service's server, wrongly on our GPU 4
    host.answers["systemctl"] = systemctl(RUNNING, STOPPED)
    both = compute_apps((neighbour.pid, "sleep", 4000, 4), (foreign.pid, "sleep", 4000, 5))
    host.smi = [
        (query_gpu(8, {4: 4100, 5: 4100}), both),
        (query_gpu(8, {4: 4100}), compute_apps((neighbour.pid, "sleep", 4000, 4))),
    ]
    args = {"paths": paths, "unit_name": "sglang-b.service", "gpus": [4, 5, 6, 7], "kill_gpu_holders": True}
    failed, result = run_module(stop, {**args, "gpu_release_timeout_s": 0})
    assert [k["pid"] for k in result["gpus"]["killed"]] == [foreign.pid]
    assert foreign.poll() is not None and neighbour.poll() is None
    assert failed and result["msg"].endswith(
        f"GPU 4 has 4100 MiB used by PID {neighbour.pid} sleep 4000 MiB of sglang-a.service "
        "(sglang-a.service: another orchestrator unit on this host, never killed)"
    )


def test_the_stop_waits_for_a_docker_container_outside_the_cgroup(stop, host, paths, run_module):
    """The unit is inactive and its cgroup empty, but docker still lists its container (the
    daemon parents it) for one more look: the stop waits, then goes on to the GPUs."""
    host.answers["systemctl"] = systemctl(RUNNING, STOPPED)
    docker = Engine("docker", {"a1b2": ("sglang.service", 4243), "c3d4": ("sglang-a.service", 5000)})
    looks = []

    def ps(argv: list[str]) -> tuple[int, str, str]:
        if argv[1] == "ps":
            looks.append(argv)
            if len(looks) == 2:
                docker.containers.pop("a1b2")
        return docker(argv)

    host.answers["docker"] = ps
    host.smi = [RELEASED]
    failed, result = run_module(stop, {"paths": paths, "unit_name": "sglang.service", "gpus": [0]})
    assert not failed, result.get("msg")
    assert len(looks) == 2 and result["stop_s"] >= 0.1  # listed at the first look, gone at the second


def test_a_container_that_outlives_its_unit_fails_the_stop(stop, host, paths, run_module):
    host.answers["systemctl"] = systemctl(RUNNING, STOPPED)
    host.answers["podman"] = Engine("podman", {"a1b2": ("sglang.service", 4243)})
    host.smi = [RELEASED]
    failed, result = run_module(
        stop, {"paths": paths, "unit_name": "sglang.service", "gpus": [0], "gone_timeout_s": 0.2}
    )
    assert failed and result["msg"] == "sglang.service is stopped but its container (PID [4243]) runs on"


#: `systemctl show ssh.service` on a Debian host: a package's unit, running and enabled.
SSH = {
    "Id": "ssh.service",
    "LoadState": "loaded",
    "FragmentPath": "/lib/systemd/system/ssh.service",
    "ActiveState": "active",
    "MainPID": "612",
    "ControlGroup": "/system.slice/ssh.service",
    "UnitFileState": "enabled",
}


def test_a_unit_that_is_not_ours_is_neither_stopped_nor_disabled(stop, host, paths, run_module):
    """#21: `orchestrator stop --unit ssh.service` (or a deploy with --no-preflight) stopped it."""
    host.answers["systemctl"] = systemctl(SSH, STOPPED)
    host.smi = [RELEASED]
    failed, result = run_module(stop, {"paths": paths, "unit_name": "ssh.service", "disable": True})
    assert failed and result["msg"] == (
        "ssh.service is not orchestrator's: systemd loads it from /lib/systemd/system/ssh.service: "
        "orchestrator stops only the units it deployed"
    )
    assert all(call[1] == "show" for call in host.ran("systemctl")) and result["changed"] is False


def test_a_file_of_someone_elses_in_the_unit_dir_is_not_stopped(stop, host, paths, run_module):
    """Ours is a unit file with our header line or our facts (the other tests' units have facts or
    no file at all); this one was written by hand."""
    Path(paths["unit_dir"], "sglang.service").write_text("[Service]\nExecStart=/opt/other\n")
    ours = {**RUNNING, "Id": "sglang.service", "FragmentPath": str(Path(paths["unit_dir"], "sglang.service"))}
    host.answers["systemctl"] = systemctl(ours, STOPPED)
    failed, result = run_module(stop, {"paths": paths, "unit_name": "sglang.service"})
    assert failed and "has no '# Managed by orchestrator:' line and no facts" in result["msg"]
    assert all(call[1] == "show" for call in host.ran("systemctl"))
    store_unit(paths, "sglang.service", installed=False, gpus=[0])  # our facts: ours after all
    host.smi = [RELEASED]
    failed, result = run_module(stop, {"paths": paths, "unit_name": "sglang.service"})
    assert not failed, result["msg"]
    assert ["/usr/bin/systemctl", "stop", "sglang.service"] in host.calls
