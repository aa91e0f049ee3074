"""roles/sglang_restart: the restart as one transaction runs the steps of sglang_stop, sglang_unit,
sglang_start, sglang_health_wait and sglang_record in order, each with its own options, stops at the
first that fails and names it, and leaves a server still starting to the play's own health wait.

The steps themselves are tested with their own modules (test_sglang_stop.py, ...); here each is
replaced by a recorder, to prove what the transaction does with their results and failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host import (
    healthwait,
    record,
    start,
    stop,
    unitfile,
)
from hostfakes import load_module

from orchestrator.paths import MODULES_DIR

MODULE = MODULES_DIR / "sglang_restart.py"
PATHS = {"unit_dir": "/etc/systemd/system", "state_dir": "/var/lib/orchestrator", "lock_dir": "/run/o"}
ARGS: dict[str, Any] = {
    "stop": {"unit_name": "sglang.service", "paths": PATHS},
    "unit": {"unit_name": "sglang.service", "paths": PATHS, "content": "[Unit]\n", "facts": {}},
    "start": {"unit_name": "sglang.service"},
    "health": {"url": "http://127.0.0.1:30000/health", "unit": "sglang.service", "report_s": 5},
    "record": {
        "unit_name": "sglang.service",
        "paths": PATHS,
        "profile": "cg_5tok",
        "digest": "0123456789abcdef",
        "unit": "[Unit]\n",
        "facts": {},
    },
}


@pytest.fixture
def restart():
    return load_module("sglang_restart")


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict]]:
    """Each step's run() records (its name, the options it got) and returns what its module would."""
    ran: list[tuple[str, dict]] = []
    results = {
        stop: {"changed": True, "was_active": True, "main_pid": 10, "stop_s": 0.2, "disabled": False},
        unitfile: {"changed": False, "digest": "0123456789abcdef", "unit_path": "/etc/systemd/system/x"},
        start: {
            "changed": True,
            "reloaded": False,
            "enabled": False,
            "started": True,
            "invocation_id": "inv1",
        },
        healthwait: {"changed": False, "done": True, "reason": "healthy", "elapsed_s": 2.0},
        record: {"changed": True, "recorded": True, "released": True},
    }
    for step, result in results.items():

        def run(module: Any, p: dict, _step: Any = step, _result: dict = result) -> dict:
            ran.append((_step.__name__.rsplit(".", 1)[-1], p))
            return dict(_result)

        monkeypatch.setattr(step, "run", run)
    return ran


def test_every_step_runs_in_order_and_returns_under_its_modules_name(restart, steps, run_module):
    failed, result = run_module(restart, ARGS)
    assert not failed
    assert [name for name, _ in steps] == ["stop", "unitfile", "start", "healthwait", "record"]
    assert [s["action"] for s in result["steps"]] == [
        "sglang_stop",
        "sglang_unit",
        "sglang_start",
        "sglang_health_wait",
        "sglang_record",
    ]
    assert result["done"] and result["recorded"] and result["released"] and result["changed"]
    assert result["invocation_id"] == "inv1" and result["failed_step"] == ""
    assert all(s["took_s"] >= 0 and not s["failed"] for s in result["steps"])


def test_the_health_wait_watches_the_invocation_the_start_began(restart, steps, run_module):
    run_module(restart, ARGS)
    health = dict(steps)["healthwait"]
    assert health["invocation_id"] == "inv1" and health["report_s"] == 5


def test_a_failed_step_ends_the_transaction_naming_it(restart, steps, run_module, monkeypatch):
    def refused(module: Any, p: dict) -> dict:
        module.fail_json(msg="systemctl start sglang.service failed (1): Job failed.", started=True)
        raise AssertionError("fail_json returned")

    monkeypatch.setattr(start, "run", refused)
    failed, result = run_module(restart, ARGS)
    assert failed and result["failed_step"] == "sglang_start"
    assert result["msg"] == "systemctl start sglang.service failed (1): Job failed."
    assert [(s["action"], s["failed"]) for s in result["steps"]] == [
        ("sglang_stop", False),
        ("sglang_unit", False),
        ("sglang_start", True),
    ]
    assert result["steps"][-1]["result"]["msg"].startswith("systemctl start")
    assert [name for name, _ in steps] == ["stop", "unitfile"]  # no health wait, no record
    assert result["changed"]  # the stop changed the host: the controller owes a rollback


def test_a_server_still_starting_is_left_to_the_plays_health_wait(restart, steps, run_module, monkeypatch):
    def starting(module: Any, p: dict) -> dict:
        return {"changed": False, "done": False, "reason": "starting", "elapsed_s": 5.0}

    monkeypatch.setattr(healthwait, "run", starting)
    failed, result = run_module(restart, ARGS)
    assert not failed and not result["done"] and not result["recorded"]
    assert result["steps"][-1]["action"] == "sglang_health_wait"
    assert "record" not in dict(steps)


def test_without_record_options_nothing_is_recorded(restart, steps, run_module):
    failed, result = run_module(restart, {k: v for k, v in ARGS.items() if k != "record"})
    assert not failed and result["done"] and not result["recorded"] and not result["released"]
    assert "record" not in dict(steps)


def test_check_mode_runs_only_the_stop_and_the_unit(restart, steps, run_module):
    failed, result = run_module(restart, ARGS, check_mode=True)
    assert not failed and [name for name, _ in steps] == ["stop", "unitfile"]
    assert not result["done"] and result["invocation_id"] == ""


def test_each_steps_options_are_checked_by_that_steps_own_spec(restart, steps, run_module):
    """A bad option of one step fails before anything runs, as that module would fail."""
    bad = {**ARGS, "stop": {**ARGS["stop"], "gone_timeout_s": "soon"}}
    failed, result = run_module(restart, bad)
    assert failed and "gone_timeout_s" in result["msg"] and steps == []


def test_no_step_starts_once_the_control_machine_is_gone(restart, steps, run_module, monkeypatch):
    """Ctrl-C on the control machine mid-stop: the stop ends, but no unit is written and nothing is
    started or recorded behind the rollback's back."""
    seen = iter([True, False])
    monkeypatch.setattr(restart, "watched", lambda: next(seen))
    with pytest.raises(SystemExit):
        run_module(restart, ARGS)
    assert [name for name, _ in steps] == ["stop"]


def test_a_closed_pipe_is_a_control_machine_gone(tmp_path):
    """watched() on a stdout whose reader went, as sshd leaves it once the session closed."""
    script = (
        "import os, sys, importlib.util\n"
        "from orchestrator.paths import host_imports; host_imports()\n"
        "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"
        f"spec = importlib.util.spec_from_file_location('m', {str(MODULE)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "sys.stderr.write(str(m.watched()))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    gone = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert gone.stderr.strip().endswith("False"), gone.stderr
    script = script.replace("os.close(r); ", "")
    kept = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert kept.stderr.strip().endswith("True"), kept.stderr


def test_a_step_that_raises_is_named_with_the_steps_before_it(restart, steps, run_module, monkeypatch):
    """A bug in a step (or AnsibleModule's own failure inside it: a chown, a missing binary) ends the
    transaction as a failure of that step, the stop's result kept for the report and rollback."""

    def broken(module: Any, p: dict) -> dict:
        raise KeyError("facts")

    monkeypatch.setattr(unitfile, "run", broken)
    failed, result = run_module(restart, ARGS)
    assert failed and result["failed_step"] == "sglang_unit"
    assert (
        result["msg"] == "sglang_unit failed: KeyError: 'facts'"
        and "Traceback" in result["steps"][-1]["result"]["exception"]
    )
    assert [s["action"] for s in result["steps"]] == ["sglang_stop", "sglang_unit"]


def test_one_step_alone_runs_only_that_step(restart, steps, run_module):
    """A multi-node server's ranks go a step at a time (playbooks/tasks/restart_lockstep.yml)."""
    failed, result = run_module(restart, {"stop": ARGS["stop"]})
    assert not failed and [name for name, _ in steps] == ["stop"]
    assert not result["done"] and not result["recorded"]


def test_ansibles_own_failure_with_an_exception_object_is_named_with_its_step(
    restart, steps, run_module, monkeypatch
):
    """ansible-core 2.19's AnsibleModule fails with the exception itself (run_command's OSError, a
    chown): it comes back as text, under the step it happened in."""

    def missing(module: Any, p: dict) -> dict:
        module.fail_json(msg="Error executing command.", exception=FileNotFoundError(2, "No such file"))
        raise AssertionError("fail_json returned")

    monkeypatch.setattr(start, "run", missing)
    failed, result = run_module(restart, ARGS)
    assert failed and result["failed_step"] == "sglang_start" and result["msg"] == "Error executing command."
    assert "FileNotFoundError" in result["steps"][-1]["result"]["exception"]
    json.dumps(result)  # all of it goes back as JSON
