"""roles/sglang_service: sglang_start reloads systemd only when the unit changed, enables and starts
only what is not already, and names systemctl's complaint."""

from __future__ import annotations

import pytest
from hostfakes import load_module, systemctl_show


@pytest.fixture
def sglang_start():
    return load_module("sglang_start")


def _answers(show: tuple[int, str, str], start_rc: int = 0):
    def systemctl(argv: list[str]) -> tuple[int, str, str]:
        if argv[1] == "show":
            return show
        return (start_rc, "", "Job for sglang.service failed.") if argv[1] == "start" else (0, "", "")

    return systemctl


def _ran(host) -> list[str]:
    return [" ".join(c[1:]) for c in host.ran("systemctl") if c[1] != "show"]


def test_a_changed_unit_is_reloaded_enabled_and_started(sglang_start, host, run_module):
    state = systemctl_show(
        LoadState="loaded", NeedDaemonReload="yes", UnitFileState="disabled", ActiveState="inactive"
    )
    host.answers["systemctl"] = _answers(state)
    failed, result = run_module(sglang_start, {"unit_name": "sglang.service"})
    assert not failed and result["changed"] and result["reloaded"] and result["enabled"] and result["started"]
    assert _ran(host) == ["daemon-reload", "enable --quiet sglang.service", "start sglang.service"]


def test_an_unchanged_enabled_unit_is_only_started(sglang_start, host, run_module):
    """--force-restart with the same unit: no reload (it cost 0.1 s), no enable."""
    state = systemctl_show(
        LoadState="loaded", NeedDaemonReload="no", UnitFileState="enabled", ActiveState="inactive"
    )
    host.answers["systemctl"] = _answers(state)
    failed, result = run_module(sglang_start, {"unit_name": "sglang.service"})
    assert not failed and result["started"] and not result["reloaded"] and not result["enabled"]
    assert _ran(host) == ["start sglang.service"]


def test_a_unit_systemd_does_not_know_yet_is_reloaded(sglang_start, host, run_module):
    state = systemctl_show(
        LoadState="not-found", NeedDaemonReload="no", UnitFileState="", ActiveState="inactive"
    )
    host.answers["systemctl"] = _answers(state)
    failed, _ = run_module(sglang_start, {"unit_name": "sglang.service"})
    assert not failed and _ran(host)[0] == "daemon-reload"


def test_a_refused_start_names_the_unit_and_systemctls_message(sglang_start, host, run_module):
    state = systemctl_show(
        LoadState="loaded", NeedDaemonReload="no", UnitFileState="enabled", ActiveState="failed"
    )
    host.answers["systemctl"] = _answers(state, start_rc=1)
    failed, result = run_module(sglang_start, {"unit_name": "sglang.service"})
    assert (
        failed
        and result["msg"] == "systemctl start sglang.service failed (1): Job for sglang.service failed."
    )


def test_a_start_that_never_ran_the_server_says_systemds_status(sglang_start, host, run_module):
    """A start systemd itself failed (here its cgroup, as 16 lab hosts restarting at once on 2 cores
    once gave): the job message alone says only 'the control process exited with error code'."""
    state = systemctl_show(
        LoadState="loaded",
        NeedDaemonReload="no",
        UnitFileState="enabled",
        ActiveState="failed",
        ExecMainStatus="219",
        ExecMainCode="1",
        Result="exit-code",
    )
    host.answers["systemctl"] = _answers(state, start_rc=1)
    failed, result = run_module(sglang_start, {"unit_name": "sglang.service"})
    assert failed and result["msg"] == (
        "systemctl start sglang.service failed (1): Job for sglang.service failed. "
        "(status=219/CGROUP, result exit-code)"
    )


def test_check_mode_changes_nothing(sglang_start, host, run_module):
    state = systemctl_show(
        LoadState="loaded", NeedDaemonReload="yes", UnitFileState="enabled", ActiveState="inactive"
    )
    host.answers["systemctl"] = _answers(state)
    failed, result = run_module(sglang_start, {"unit_name": "sglang.service"}, check_mode=True)
    assert not failed and result["changed"] and _ran(host) == []
