"""roles/sglang_health: /health polled while the unit is watched."""

from __future__ import annotations

import pytest
from hostfakes import load_module, systemctl_show

ALIVE = {"ActiveState": "active", "MainPID": "10", "NRestarts": "0", "InvocationID": "abc"}


@pytest.fixture
def health():
    return load_module("sglang_health", "sglang_health_wait")


def test_healthy(health, host, run_module, server):
    host.answers["systemctl"] = [systemctl_show(**ALIVE)]
    failed, result = run_module(health, {"url": f"{server}/health", "unit": "sglang.service", "timeout_s": 5})
    assert not failed and (result["reason"], result["status"]) == ("healthy", 200)
    assert all("--timestamp=us+utc" in call for call in host.ran("systemctl"))


def test_a_server_that_exits_fails_at_once_with_this_starts_journal(health, host, run_module, server):
    host.answers["systemctl"] = [
        systemctl_show(**ALIVE),
        systemctl_show(**ALIVE),
        systemctl_show(
            **{**ALIVE, "ActiveState": "failed", "MainPID": "0", "Result": "exit-code", "ExecMainStatus": "1"}
        ),
    ]
    host.answers["journalctl"] = [(0, "loading\nTraceback\nCUDA out of memory\n", "")]
    args = {"url": f"{server}/loading", "unit": "sglang.service", "timeout_s": 60, "interval_s": 0.05}
    failed, result = run_module(health, args)
    assert failed and result["reason"] == "exited" and result["status"] == 503
    assert result["msg"].startswith("the server exited (exit-code, status 1) after ")
    assert result["journal"][-1] == "CUDA out of memory"
    assert host.ran("journalctl")[0][1] == "_SYSTEMD_INVOCATION_ID=abc"


def test_no_200_in_time(health, host, run_module):
    host.answers["systemctl"] = [systemctl_show(**ALIVE)]
    host.answers["journalctl"] = [(0, "", "")]
    args = {
        "url": "http://127.0.0.1:9/health",
        "unit": "sglang.service",
        "timeout_s": 0.1,
        "interval_s": 0.05,
    }
    failed, result = run_module(health, args)
    assert failed and result["reason"] == "timeout"
    assert result["msg"].startswith("no 200 from http://127.0.0.1:9/health within 0 s (last status None)")
