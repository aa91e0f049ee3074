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


#: Restart=on-failure, the server just died: systemd waits RestartSec before starting it again.
AUTO_RESTART = {
    **ALIVE,
    "ActiveState": "activating",
    "SubState": "auto-restart",
    "MainPID": "0",
    "NRestarts": "1",
    "Result": "exit-code",
    "ExecMainStatus": "1",
}


def test_a_server_that_dies_under_restart_on_failure_fails_at_once(health, host, run_module):
    """systemd restarting the dead server (Restart=on-failure) is no reason to wait: the deploy
    fails as soon as it sees it, within the 30-minute health timeout's first polls."""
    host.answers["systemctl"] = [
        systemctl_show(**ALIVE),
        systemctl_show(**ALIVE),
        systemctl_show(**AUTO_RESTART),
    ]
    host.answers["journalctl"] = [(0, "loading\nTraceback\nCUDA out of memory\n", "")]
    args = {
        "url": "http://127.0.0.1:9/health",
        "unit": "sglang.service",
        "timeout_s": 1800,
        "interval_s": 0.05,
    }
    failed, result = run_module(health, args)
    assert failed and result["reason"] == "exited" and len(host.ran("systemctl")) == 3
    assert result["msg"].startswith("the server exited (exit-code, status 1) after ")
    assert (
        result["unit_state"]["SubState"] == "auto-restart" and result["journal"][-1] == "CUDA out of memory"
    )


def test_a_server_already_restarted_between_two_polls_fails_at_once(health, host, run_module):
    """RestartSec shorter than a poll: the next look finds a new MainPID and NRestarts 1."""
    restarted = {**ALIVE, "MainPID": "11", "NRestarts": "1", "InvocationID": "def"}
    host.answers["systemctl"] = [
        systemctl_show(**ALIVE),
        systemctl_show(**ALIVE),
        systemctl_show(**restarted),
    ]
    host.answers["journalctl"] = [(0, "loading\n", "")]
    args = {
        "url": "http://127.0.0.1:9/health",
        "unit": "sglang.service",
        "timeout_s": 1800,
        "interval_s": 0.05,
    }
    failed, result = run_module(health, args)
    assert failed and result["reason"] == "restarted" and len(host.ran("systemctl")) == 3
    assert result["msg"].startswith("the server restarted (MainPID or NRestarts changed) after ")
    # Why it died is in the journal of the start that failed, not of the one systemd made after.
    (journal,) = host.ran("journalctl")
    assert f"_SYSTEMD_INVOCATION_ID={ALIVE['InvocationID']}" in journal, journal
