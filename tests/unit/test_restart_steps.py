"""A restart run as one transaction on the host (roles/sglang_restart) reads, on the control machine,
as the tasks it replaced: runner.split_steps makes each step an event of that step's module, so the
report names the step that failed, a rollback is owed once the stop ran, and the live view shows
each step."""

from __future__ import annotations

from typing import Any

from hostresults import result

from orchestrator.hosts import host_report, readback
from orchestrator.hosts.runner import HostRun, TaskEvent, split_steps

STOPPED = result("sglang_stop", changed=True, was_active=True, main_pid=10, stop_s=0.2)
WRITTEN = result("sglang_unit", digest="0123456789abcdef", unit_path="/etc/systemd/system/sglang.service")


def _restart(kind: str, *steps: tuple[str, bool, dict[str, Any]], **top: Any) -> TaskEvent:
    listed = [{"action": a, "failed": f, "took_s": 0.1, "result": r} for a, f, r in steps]
    return TaskEvent("lab1", kind, "sglang_restart", "sglang_restart", {"steps": listed, **top})


def test_each_step_is_an_event_of_its_own_module() -> None:
    started = result("sglang_start", changed=True, started=True, invocation_id="i")
    ev = _restart(
        "changed",
        ("sglang_stop", False, STOPPED),
        ("sglang_unit", False, WRITTEN),
        ("sglang_start", False, started),
    )
    split = split_steps(ev)
    assert [(e.kind, e.action) for e in split] == [
        ("start", "sglang_stop"),
        ("changed", "sglang_stop"),
        ("start", "sglang_unit"),
        ("ok", "sglang_unit"),
        ("start", "sglang_start"),
        ("changed", "sglang_start"),
    ]
    assert split[1].result == STOPPED


def test_a_failed_step_is_what_the_report_names_and_a_rollback_is_owed() -> None:
    msg = "systemd-analyze verify refused sglang.service: Unknown key name 'Foo'"
    ev = _restart("failed", ("sglang_stop", False, STOPPED), ("sglang_unit", True, {"msg": msg}), msg=msg)
    run = HostRun("lab1", [TaskEvent("lab1", "start", "", "sglang_restart", {}), *split_steps(ev)])
    f = readback.of_run(run)
    assert f.failed is not None and f.failed.action == "sglang_unit" and f.message == msg
    assert f.stopped  # the stop ran: the host is owed its previous unit back
    assert host_report.step(f) == "write unit"


def test_a_server_still_starting_is_a_progress_report_not_a_result() -> None:
    health = result("sglang_health_wait", done=False, reason="starting")
    ev = _restart("changed", ("sglang_stop", False, STOPPED), ("sglang_health_wait", False, health))
    assert [e.kind for e in split_steps(ev)][-1] == "progress"


def test_its_start_and_an_end_that_names_no_step_are_the_restarts_own() -> None:
    """Where nothing came back (the connection went, the module died), the restart failed as a
    whole: the server may be stopped, so a rollback is owed; a Ctrl-C during it names the restart."""
    assert [(e.kind, e.action) for e in split_steps(_restart("start"))] == [("start", "sglang_restart")]
    assert readback.step_of(split_steps(_restart("start"))[0]) == "restart"
    lost = TaskEvent("lab1", "unreachable", "", "sglang_restart", {"msg": "ssh: connection closed"})
    assert [(e.kind, e.action) for e in split_steps(lost)] == [("unreachable", "sglang_restart")]
    died = TaskEvent("lab1", "failed", "", "sglang_restart", {"msg": "MODULE FAILURE", "rc": 1})
    [failed] = split_steps(died)
    assert failed.kind == "failed" and failed.result["msg"] == "MODULE FAILURE"
    f = readback.of_run(HostRun("lab1", [failed]))
    assert f.stopped and host_report.step(f) == "restart"


def test_a_step_orchestrator_does_not_know_fails_naming_it() -> None:
    ev = _restart("changed", ("sglang_stop", False, STOPPED), ("rm_rf", False, {}))
    split = split_steps(ev)
    assert split[-1].kind == "failed" and "rm_rf" in split[-1].result["msg"]


def test_other_events_are_themselves() -> None:
    ev = TaskEvent("lab1", "ok", "sglang_probe", "sglang_probe", {"x": 1})
    assert split_steps(ev) == [ev]


def test_a_step_with_a_malformed_duration_is_still_read() -> None:
    ev = _restart("changed", ("sglang_stop", False, STOPPED))
    ev.result["steps"][0]["took_s"] = "soon"
    assert [(e.kind, e.action) for e in split_steps(ev)] == [
        ("start", "sglang_stop"),
        ("changed", "sglang_stop"),
    ]
