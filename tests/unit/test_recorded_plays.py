"""The recorded plays themselves (tests/data/plays/) and the harness that answers with them (plays.py):
each recording names the lab test that made it and holds nothing secret, every one is used, and the
harness refuses to answer a play with a recording made for another."""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
from pathlib import Path

import pytest
from plays import PLAYS, PlayMismatch, Recording, Script, lab_inventory

from orchestrator.hosts import deploy, runner
from orchestrator.profile import model as profile_mod

CHECKOUT = Path(__file__).resolve().parents[2]
#: Text shaped like a credential (kept apart from scripts/record_play.py's own: a second opinion).
SECRET = re.compile(r"sk-[A-Za-z0-9]{6}|hf_[A-Za-z0-9]{6}|Bearer \S|PRIVATE KEY|--api-key \S")
RECORDINGS = sorted(PLAYS.glob("*.json"))


def _recorder():
    spec = importlib.util.spec_from_file_location("record_play", CHECKOUT / "scripts" / "record_play.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: p.stem)
def test_each_recording_names_the_lab_test_that_made_it_and_holds_no_secret(path: Path) -> None:
    text = path.read_text()
    data = json.loads(text)
    file, _, name = data["recorded"]["lab_test"].partition("::")
    assert (CHECKOUT / file).is_file() and f"def {name.split('[')[0]}(" in (CHECKOUT / file).read_text()
    assert data["recorded"]["status"] in ("successful", "failed", "canceled")
    assert not SECRET.search(text) and '"invocation"' not in text


def test_every_recording_is_used_by_a_test() -> None:
    tests = "".join(p.read_text() for p in (CHECKOUT / "tests" / "unit").glob("test_*.py"))
    unused = [p.stem for p in RECORDINGS if f'Recording.load("{p.stem}")' not in tests]
    assert not unused, f"recordings no test answers with: {unused}"


def test_the_recorder_keeps_the_events_and_drops_arguments_and_secrets(tmp_path: Path) -> None:
    """A run as ansible-runner leaves it, cut to two events of one host."""
    run = tmp_path / "20261202-133759-deploy-0dbb73e7"
    artifacts = run / "artifacts" / "a1"
    (artifacts / "job_events").mkdir(parents=True)
    (artifacts / "status").write_text("failed")
    (artifacts / "rc").write_text("2")
    secret = "sk-orch-" + "5" * 24
    env = {"PYTEST_CURRENT_TEST": "tests/lab/test_failures.py::test_cuda_oom_from_mem_fraction (call)"}
    (artifacts / "command").write_text(json.dumps({"env": {**env, "ORCH_TEST_API_KEY": secret}}))
    plan = {"profile": "oom", "digest": "7e4bda3a74b94d6d", "unit_name": "sglang.service", "unit": "[Unit]"}
    (run / "orch.json").write_text(json.dumps({"orch": {"hosts": {"lab1": {**plan, "facts": {"rank": 0}}}}}))
    result = {
        "msg": f"the server exited; journal said --api-key {secret}",
        "journal": [f"Authorization: Bearer {secret}"],
        "api_key": secret,
        "invocation": {"module_args": {"api_key": secret}},
        "_ansible_no_log": False,
        "changed": False,
    }
    for n, (event, res) in enumerate([("runner_on_start", None), ("runner_on_failed", result)], 1):
        data = {"host": "lab1", "role": "sglang_health", "task_action": "sglang_health_wait", "res": res}
        body = {
            "counter": n,
            "event": event,
            "created": f"2026-12-02T13:37:5{n}.000000+00:00",
            "event_data": data,
        }
        (artifacts / "job_events" / f"{n}-x.json").write_text(json.dumps(body))
    made = _recorder().record(run)
    assert secret not in json.dumps(made) and "invocation" not in json.dumps(made)
    [start, failed] = made["hosts"]["lab1"]["events"]
    assert start == {"kind": "start", "role": "sglang_health", "action": "sglang_health_wait"}
    assert failed["kind"] == "failed" and failed["result"]["api_key"] == "<scrubbed>"
    assert failed["result"]["msg"] == "the server exited; journal said <scrubbed>"
    assert made["hosts"]["lab1"]["elapsed_s"] == 1.0
    assert made["recorded"]["lab_test"] == "tests/lab/test_failures.py::test_cuda_oom_from_mem_fraction"
    assert (
        made["plan"]["hosts"]["lab1"]["digest"] == "7e4bda3a74b94d6d"
        and "unit" not in made["plan"]["hosts"]["lab1"]
    )


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Script:
    """A Script without the end-of-test checks: these tests provoke its refusals."""
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(deploy, "same_files", lambda *args: None)  # as plays.scripted
    return Script.install(monkeypatch)


def test_a_recording_made_for_another_unit_is_refused(script: Script, tmp_path: Path) -> None:
    script.then(Recording.load("oom"))
    with pytest.raises(
        PlayMismatch,
        match=r"lab1 is to get unit aa51abdf9266a01b \(cg_5tok\); the recording ran bfb1f6382f03fb47 \(oom\)",
    ):
        deploy.deploy(profile_mod.load("cg_5tok"), lab_inventory(tmp_path), deploy.Options(limit="lab1"))


def test_a_play_on_other_hosts_or_a_play_the_script_lacks_is_refused(script: Script, tmp_path: Path) -> None:
    inventory = lab_inventory(tmp_path)
    script.then(Recording.load("deploy_4_hosts_again"))
    with pytest.raises(
        PlayMismatch,
        match=r"deploy.yml on lab1, lab2; the script's next play is deploy_4_hosts_again, "
        r"recorded on lab1, lab2, lab3, lab4",
    ):
        deploy.deploy(profile_mod.load("cg_5tok"), inventory, deploy.Options(limit="lab1,lab2"))
    with pytest.raises(PlayMismatch, match=r"deploy.yml on lab1: the script has no play left"):
        deploy.deploy(profile_mod.load("cg_5tok"), inventory, deploy.Options(limit="lab1"))
    assert [a.hosts for a in script.asks] == [["lab1", "lab2"], ["lab1"]]


def test_the_script_takes_what_run_playbook_takes() -> None:
    """Script stands in for runner.run_playbook: the same parameters, so a new one of the runner's
    fails here rather than as a TypeError in a harness test."""
    ours = list(inspect.signature(Script.__call__).parameters.values())[1:]  # without self
    theirs = list(inspect.signature(runner.run_playbook).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours] == [(p.name, p.kind, p.default) for p in theirs]
