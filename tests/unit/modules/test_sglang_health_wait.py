"""roles/sglang_health: /health polled while the unit is watched."""

from __future__ import annotations

import json
import time

import pytest
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import healthwait
from hostfakes import load_module, systemctl_show

ALIVE = {"ActiveState": "active", "MainPID": "10", "NRestarts": "0", "InvocationID": "abc"}


@pytest.fixture
def health():
    return load_module("sglang_health_wait")


def test_healthy(health, host, run_module, server):
    host.answers["systemctl"] = [systemctl_show(**ALIVE)]
    host.answers["journalctl"] = [(0, "", "")]
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
    (journal,) = [argv for argv in host.ran("journalctl") if "cat" in argv]
    assert f"_SYSTEMD_INVOCATION_ID={ALIVE['InvocationID']}" in journal, journal


def journal_of(origin_us: int, *entries: tuple[float, object]) -> object:
    """journalctl as the health wait calls it: `-o json` gives `entries` ((seconds after the
    process start, MESSAGE as text or journald's byte array)); `-o cat` their text."""

    def answer(argv: list[str]) -> tuple[int, str, str]:
        if "json" in argv:
            after = next((int(a.split("=c")[1]) for a in argv if a.startswith("--after-cursor=")), -1)
            rows = [
                {"__CURSOR": f"c{i}", "__MONOTONIC_TIMESTAMP": str(origin_us + int(at * 1e6)), "MESSAGE": m}
                for i, (at, m) in enumerate(entries)
                if i > after
            ]
            return 0, "".join(json.dumps(r) + "\n" for r in rows), ""
        return 0, "".join(f"{m}\n" for _, m in entries if isinstance(m, str)), ""

    return answer


def test_a_start_quiet_past_its_phases_limit_fails_as_stalled_naming_the_phase(health, host, run_module):
    """No line for 8 s in the weights phase against a limit of 5 s: stalled, at once, not at the
    30-minute timeout; the phases so far come with it. The bar arrives as journald's byte array."""
    origin = int(time.monotonic() * 1e6) - 10_000_000
    host.answers["systemctl"] = [systemctl_show(**ALIVE, ExecMainStartTimestampMonotonic=str(origin))]
    bar = list(b"\rLoading safetensors checkpoint shards:  25% Completed | 2/8 [00:01<00:03]")
    host.answers["journalctl"] = journal_of(
        origin,
        (1.0, "[2026-12-03 06:00:00 TP0] Init torch distributed begin."),
        (1.5, "[2026-12-03 06:00:00 TP0] Load weight begin. avail mem=139.31 GB"),
        (2.0, bar),
    )
    args = {
        "url": "http://127.0.0.1:9/health",
        "unit": "sglang.service",
        "timeout_s": 1800,
        "interval_s": 0.05,
    }
    failed, result = run_module(health, args | {"stall_s": {"weights": 5, "*": 600}})
    assert failed and result["reason"] == "stalled" and result["phase"] == "weights"
    assert result["progress"] == {"done": 2, "total": 8, "detail": ""}
    assert result["stalled"]["phase"] == "weights" and result["stalled"]["limit_s"] == 5
    assert result["msg"].startswith(
        "start-up stalled in weights: no new log line for 8 s (its limit 5 s) after 1"
    )
    assert [p["phase"] for p in result["phases"]] == ["launch", "init", "weights"]
    assert result["phases"][0]["s"] == 1.0 and 9.5 < result["elapsed_s"] < 12
    # Within its limit the same start is not stalled: the wait goes on to report it, still starting.
    failed, result = run_module(health, args | {"stall_s": {"weights": 60}, "report_s": 0.3})
    assert not failed and (result["done"], result["reason"], result["phase"]) == (
        False,
        "starting",
        "weights",
    )


def test_another_invocation_than_the_start_gave_is_a_restart_even_between_two_reports(
    health, host, run_module
):
    """systemd restarted the server (Restart=on-failure) between two of the wait's calls: the new
    invocation alone says so, and the journal shown is that of the start that died."""
    host.answers["systemctl"] = [systemctl_show(**{**ALIVE, "InvocationID": "def", "NRestarts": "1"})]
    host.answers["journalctl"] = [(0, "", "")]
    args = {"url": "http://127.0.0.1:9/health", "unit": "sglang.service", "timeout_s": 60, "interval_s": 0.05}
    failed, result = run_module(health, args | {"invocation_id": "abc"})
    assert failed and result["reason"] == "restarted"
    (journal,) = [argv for argv in host.ran("journalctl") if "cat" in argv]
    assert "_SYSTEMD_INVOCATION_ID=abc" in journal


def test_a_weight_load_reading_from_storage_is_not_stalled_without_a_line(
    health, host, run_module, monkeypatch
):
    """Under journald the loader's bar arrives only when it ends: while the unit's processes keep
    reading from storage the weights phase makes progress, quiet or not."""
    origin = int(time.monotonic() * 1e6) - 10_000_000
    state = {**ALIVE, "ExecMainStartTimestampMonotonic": str(origin), "ControlGroup": "/system.slice/s"}
    host.answers["systemctl"] = [systemctl_show(**state)]
    host.answers["journalctl"] = journal_of(origin, (1.0, "[2026-12-03 06:00:00 TP0] Load weight begin."))
    reads = iter(range(1, 10**6))
    monkeypatch.setattr(healthwait, "read_bytes", lambda cgroup: next(reads) * 2**20)
    args = {
        "url": "http://127.0.0.1:9/health",
        "unit": "sglang.service",
        "timeout_s": 1800,
        "interval_s": 0.05,
    }
    failed, result = run_module(
        health, args | {"stall_s": {"weights": 5}, "report_s": 2.5, "usual_s": {"weights": 30}}
    )
    assert not failed and (result["reason"], result["phase"]) == ("starting", "weights")
    assert result["quiet_s"] < 2 and 15 < result["eta_s"] < 20  # 30 s usual, 11.5 s in
    monkeypatch.setattr(healthwait, "read_bytes", lambda cgroup: 0)  # the reads stop: stalled
    failed, result = run_module(health, args | {"stall_s": {"weights": 5}})
    assert failed and result["reason"] == "stalled"
