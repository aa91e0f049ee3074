"""roles/sglang_stop: stop, wait for the cgroup to empty, then for the GPUs to be released."""

from __future__ import annotations

import pytest
from hostfakes import capture, load_module, systemctl_show

RUNNING = {"LoadState": "loaded", "ActiveState": "active", "MainPID": "4242", "ControlGroup": "/gone.slice/x"}
STOPPED = {"LoadState": "loaded", "ActiveState": "inactive", "MainPID": "0", "ControlGroup": ""}
KILLED = (capture("killed-query-gpu.csv"), capture("killed-compute-apps.csv"))
RELEASED = (capture("released-query-gpu.csv"), capture("released-compute-apps.csv"))


@pytest.fixture
def stop():
    return load_module("sglang_stop", "sglang_stop")


def systemctl(before: dict, after: dict):
    stopped = []

    def answer(argv: list[str]) -> tuple[int, str, str]:
        if argv[1] == "stop":
            stopped.append(argv[2])
            return 0, "", ""
        return systemctl_show(**(after if stopped else before))

    return answer


def test_stop_then_wait_for_the_gpus(stop, host, run_module):
    host.answers["systemctl"] = systemctl(RUNNING, STOPPED)
    host.smi = [KILLED, KILLED, RELEASED]
    failed, result = run_module(stop, {"unit_name": "sglang.service", "gpus": [0]})
    assert not failed, result.get("msg")
    assert (result["changed"], result["was_active"], result["main_pid"]) == (True, True, 4242)
    assert result["stop_s"] >= 0 and ["/usr/bin/systemctl", "stop", "sglang.service"] in host.calls
    assert result["gpus"]["idle"] and result["gpus"]["waited_s"] > 0 and result["gpus"]["killed"] == []


def test_gpus_never_released_fail_with_the_gpu_idle_message(stop, host, run_module):
    host.answers["systemctl"] = systemctl(RUNNING, STOPPED)
    host.smi = [KILLED]
    failed, result = run_module(stop, {"unit_name": "sglang.service", "gpu_release_timeout_s": 0.3})
    assert failed
    assert result["msg"].startswith("GPUs not idle after waiting 0.")
    assert result["msg"].endswith(": GPU 0 has 4623 MiB used by PID 443 [No data] 4614 MiB")
    assert result["was_active"] and not result["gpus"]["idle"]


def test_a_unit_that_does_not_exist_is_already_stopped(stop, host, run_module):
    host.answers["systemctl"] = systemctl(
        {"LoadState": "not-found", "ActiveState": "inactive", "MainPID": "0"}, {}
    )
    host.smi = [RELEASED]
    failed, result = run_module(stop, {"unit_name": "sglang.service"})
    assert not failed and result["changed"] is False and result["stop_s"] == 0.0
    assert host.ran("systemctl") == [host.calls[0]]  # only the show


def test_check_mode_stops_nothing_and_reports_busy_gpus(stop, host, run_module):
    host.answers["systemctl"] = systemctl(RUNNING, STOPPED)
    host.smi = [KILLED]
    failed, result = run_module(stop, {"unit_name": "sglang.service"}, check_mode=True)
    assert not failed and result["changed"] and not result["gpus"]["idle"]
    assert all(call[1] == "show" for call in host.ran("systemctl"))


def test_processes_left_after_the_stop_fail_it(stop, host, run_module):
    host.answers["systemctl"] = systemctl(RUNNING, {**RUNNING, "ActiveState": "deactivating"})
    failed, result = run_module(stop, {"unit_name": "sglang.service", "gone_timeout_s": 0.2})
    assert failed and result["msg"] == "sglang.service still has processes ['4242'] after stop"
