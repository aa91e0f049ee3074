"""roles/gpu_idle: the module's main() against captured nvidia-smi output, and the three
defects of the module before module_utils (each of these tests fails on it)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
from hostfakes import Engine, capture, compute_apps, load_module, query_gpu, store_unit

H200 = "GPU-8b9e1fa8-32f8-da01-8524-833ee60332e7"  # the GPU of the kill captures


@pytest.fixture
def gpu_idle():
    return load_module("gpu_idle")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    """A process nvidia-smi will be made to list as a GPU holder; reaped as soon as it dies,
    so that it does not linger as a zombie."""
    proc = subprocess.Popen(["sleep", "60"])
    threading.Thread(target=proc.wait, daemon=True).start()
    yield proc
    proc.kill()


def test_an_idle_gpu_passes(gpu_idle, host, paths, run_module):
    host.smi = [
        (capture("idle-query-gpu.csv").replace(", 00000000:00:06.0", "").rsplit(",", 1)[0] + "\n", "")
    ]
    failed, result = run_module(gpu_idle, {"paths": paths, "release_timeout_s": 0})
    assert not failed and result["idle"] and result["busy"] == [] and result["changed"] is False
    assert result["gpus"][0]["memory_total_mib"] == 143771


def test_a_busy_gpu_fails_naming_its_holder(gpu_idle, host, paths, run_module):
    host.smi = [(capture("killed-query-gpu.csv"), f"516, /opt/torch/.venv/bin/python3, 4614, {H200}\n")]
    failed, result = run_module(gpu_idle, {"paths": paths, "release_timeout_s": 0})
    assert failed
    assert (
        result["msg"]
        == "GPUs not idle: GPU 0 has 4623 MiB used by PID 516 /opt/torch/.venv/bin/python3 4614 MiB"
    )


def test_the_check_waits_for_release(gpu_idle, host, paths, run_module):
    host.smi = [
        (capture("killed-query-gpu.csv"), capture("killed-compute-apps.csv")),
        (capture("released-query-gpu.csv"), capture("released-compute-apps.csv")),
    ]
    failed, result = run_module(gpu_idle, {"paths": paths, "release_timeout_s": 5, "poll_interval_s": 0.01})
    assert not failed and result["idle"]


def test_check_mode_reports_busy_gpus_without_failing_or_killing(gpu_idle, host, paths, run_module, sleeper):
    host.smi = [(capture("killed-query-gpu.csv"), f"{sleeper.pid}, sleep, 4614, {H200}\n")]
    failed, result = run_module(gpu_idle, {"paths": paths, "kill_holders": True}, check_mode=True)
    assert not failed and not result["idle"] and result["killed"] == []
    assert sleeper.poll() is None


def test_memory_used_na_is_no_crash(gpu_idle, host, paths, run_module):
    """Defect 1: int('[N/A]') raised ValueError."""
    host.smi = [(f"0, {H200}, NVIDIA H200, [N/A], [N/A]\n", "")]
    failed, result = run_module(gpu_idle, {"paths": paths, "release_timeout_s": 0})
    assert not failed and result["idle"]
    assert result["gpus"][0]["memory_used_mib"] is None
    host.smi = [(f"0, {H200}, NVIDIA H200, [N/A], [N/A]\n", f"77, python3, [N/A], {H200}\n")]
    failed, result = run_module(gpu_idle, {"paths": paths, "release_timeout_s": 0})
    assert failed and result["msg"] == "GPUs not idle: GPU 0 has ? MiB used by PID 77 python3 ? MiB"


def test_nvidia_smi_reporting_no_gpu_fails(gpu_idle, host, paths, run_module):
    """Defect 2: exit 0 with no output was reported as idle, with gpus []."""
    host.smi = [("", "")]
    failed, result = run_module(gpu_idle, {"paths": paths, "release_timeout_s": 0})
    assert failed and result["msg"].startswith("nvidia-smi reported no GPU")


def test_killed_holders_are_waited_for_even_without_a_release_timeout(
    gpu_idle, host, paths, run_module, sleeper
):
    """Defect 3: with kill_holders and release_timeout_s 0 it looked once right after the kill
    and failed, while the killed process still showed as `[No data]` holding its memory. On a
    real H200, with a holder that ignores SIGTERM (so it gets SIGKILL), the old module failed
    3 times out of 3 with "GPU 0 has 4623 MiB used by PID 597 [No data] 4614 MiB"; this one
    passed each time, about 0.3 s after the SIGKILL."""
    pid = str(sleeper.pid)
    host.smi = [
        (capture("killed-query-gpu.csv"), f"{pid}, sleep, 4614, {H200}\n"),
        (capture("killed-query-gpu.csv"), capture("killed-compute-apps.csv").replace("443", pid)),
        (capture("killed-query-gpu.csv"), capture("killed-compute-apps.csv").replace("443", pid)),
        (capture("released-query-gpu.csv"), capture("released-compute-apps.csv")),
    ]
    failed, result = run_module(
        gpu_idle, {"paths": paths, "kill_holders": True, "release_timeout_s": 0, "poll_interval_s": 0.01}
    )
    assert not failed, result["msg"]
    assert result["idle"] and result["changed"]
    assert [(k["pid"], k["process_name"]) for k in result["killed"]] == [(sleeper.pid, "sleep")]
    assert sleeper.poll() is not None


def test_a_missing_gpu_index_fails(gpu_idle, host, paths, run_module):
    host.smi = [(capture("released-query-gpu.csv"), "")]
    failed, result = run_module(gpu_idle, {"paths": paths, "gpus": [0, 3]})
    assert (
        failed
        and result["msg"]
        == "the server uses GPU 0,3 (2: TP x DP, on server.gpus); GPU 3 is not on this host: "
        "nvidia-smi reports 1 GPU (0)"
    )


def test_allow_unit_counts_only_processes_outside_the_unit(gpu_idle, host, paths, run_module):
    host.smi = [(capture("killed-query-gpu.csv"), f"1, init, 100, {H200}\n")]
    failed, result = run_module(
        gpu_idle, {"paths": paths, "allow_unit": "sglang.service", "release_timeout_s": 0}
    )
    assert failed and result["msg"] == "GPUs held outside sglang.service: GPU 0 is used by PID 1 init 100 MiB"


def test_the_report_names_the_orchestrator_unit_of_each_holder(gpu_idle, host, paths, run_module, cgroups):
    """What status reads once per host and shares out per unit: every GPU, each holder with its unit."""
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=30000, gpus=[0, 1])
    store_unit(paths, "sglang-b.service", profile="cg_2step", port=30001, gpus=[2, 3])
    cgroups.update({10: "sglang-a.service", 20: "sglang-b.service", 30: "jupyter.service"})
    apps = compute_apps((10, "python3", 500, 0), (20, "python3", 600, 2), (30, "python3", 700, 3))
    host.smi = [(query_gpu(4, {0: 500, 2: 600, 3: 700}), apps)]
    failed, result = run_module(gpu_idle, {"paths": paths, "release_timeout_s": 0, "fail": False})
    assert not failed and result["checked"] == [0, 1, 2, 3] and len(result["gpus"]) == 4
    assert [(h["pid"], h["unit"]) for h in result["holders"]] == [
        (10, "sglang-a.service"),
        (20, "sglang-b.service"),
        (30, ""),  # a unit, but none of orchestrator's
    ]


# --- containers: whose process is it when it is not in its unit's cgroup -----------------------------


@pytest.fixture
def container_tree() -> Iterator[tuple[int, int]]:
    """A container's processes as a real process tree: (its main PID, as the engine's inspect
    gives it, and a child of it that holds a GPU). Both are outside every unit's cgroup, as a
    docker container's processes are (they run under the daemon)."""
    main = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
    threading.Thread(target=main.wait, daemon=True).start()
    child = _child_of(main.pid)
    yield main.pid, child
    main.kill()
    subprocess.run(["kill", str(child)], check=False)


def _child_of(pid: int) -> int:
    from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.containers import (
        proc_parents,
    )

    for _ in range(100):
        children = [p for p, parent in proc_parents().items() if parent == pid]
        if children:
            return children[0]
        time.sleep(0.02)
    raise AssertionError(f"PID {pid} started no child")


def test_a_neighbour_container_is_never_killed_and_a_foreign_process_is(
    gpu_idle, host, paths, run_module, sleeper, container_tree
):
    """sglang-b.service (ours, GPUs 4-7) before its restart with --kill-gpu-holders: docker's
    sglang-a container holds GPU 4 from a child of its main PID, our own container GPU 6, a
    stray `sleep` GPU 5. The stray is killed; the neighbour is named and spared; ours is no
    holder. Only the label ties the containers to their units: no cgroup does."""
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=30000, gpus=[0, 1, 2, 3, 4])
    neighbour_main, neighbour_child = container_tree
    own = subprocess.Popen(["sleep", "60"])
    threading.Thread(target=own.wait, daemon=True).start()
    host.answers["docker"] = Engine(
        "docker", {"a1b2c3": ("sglang-a.service", neighbour_main), "d4e5f6": ("sglang-b.service", own.pid)}
    )
    holders = [(neighbour_child, "sleep", 100, 4), (own.pid, "sleep", 300, 6)]
    host.smi = [
        (query_gpu(8), compute_apps(*holders, (sleeper.pid, "sleep", 200, 5))),
        (query_gpu(8), compute_apps(*holders)),
    ]
    args = {"paths": paths, "gpus": [4, 5, 6, 7], "allow_unit": "sglang-b.service", "kill_holders": True}
    failed, result = run_module(gpu_idle, {**args, "release_timeout_s": 0})
    own.kill()
    assert [(k["pid"], k["unit"]) for k in result["killed"]] == [(sleeper.pid, "")]
    assert sleeper.poll() is not None or not _alive(sleeper.pid)
    assert _alive(neighbour_child) and _alive(neighbour_main)
    assert failed and result["msg"] == (
        f"GPUs held outside sglang-b.service: GPU 4 is used by PID {neighbour_child} sleep 100 MiB "
        "of sglang-a.service"
    )
    assert [(h["pid"], h["unit"]) for h in result["holders"]] == [
        (neighbour_child, "sglang-a.service"),
        (own.pid, "sglang-b.service"),
    ]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("engine", ["none", "docker without its daemon"])
def test_a_host_without_an_engine_that_answers_judges_by_cgroup_alone(
    gpu_idle, host, paths, run_module, container_tree, engine
):
    """No engine installed: none is called, and nothing fails for it; one that does not answer is
    skipped. The process is then foreign, as its cgroup says."""
    if engine != "none":
        host.answers["docker"] = Engine("docker", {"a1b2c3": ("sglang-a.service", container_tree[0])})
        host.answers["docker"].daemon = False
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=30000, gpus=[0])
    host.smi = [(query_gpu(1, {0: 100}), compute_apps((container_tree[1], "sleep", 100, 0)))]
    failed, result = run_module(gpu_idle, {"paths": paths, "release_timeout_s": 0, "fail": False})
    assert not failed and [(h["pid"], h["unit"]) for h in result["holders"]] == [(container_tree[1], "")]
    assert [c[1] for c in host.ran("docker")] == ([] if engine == "none" else ["ps"])
    assert host.ran("podman") == []


def test_a_process_in_a_units_cgroup_needs_no_engine(gpu_idle, host, paths, run_module, cgroups):
    """podman's --cgroups=split keeps the container in a sub-cgroup of its unit: the cgroup tells,
    and the engine, though installed, is not asked."""
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=30000, gpus=[0])
    host.answers["podman"] = Engine("podman")
    cgroups[4242] = "sglang-a.service/libpod-payload-0123"
    host.smi = [(query_gpu(1, {0: 100}), compute_apps((4242, "python3", 100, 0)))]
    _, result = run_module(gpu_idle, {"paths": paths, "release_timeout_s": 0, "fail": False})
    assert [(h["pid"], h["unit"]) for h in result["holders"]] == [(4242, "sglang-a.service")]
    assert host.ran("podman") == []
