"""The seam from the hosts back to Python: each module's RETURN block and its model in
orchestrator/hosts/module_results.py name the same fields, both ways, with compatible types; a result that
lacks a field, or has one orchestrator does not know, is refused naming the module and the field;
Ansible's own keys are not the module's. (tests/unit/test_seam.py checks the way out; the module
tests validate what the real modules return, through tests/unit/modules/conftest.py.)"""

from __future__ import annotations

import ast
import json
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
import yaml
from hostresults import DEFAULTS, result
from pydantic import BaseModel

from orchestrator.hosts import module_results, readback
from orchestrator.hosts.module_results import SHAPES, ResultError, parse
from orchestrator.hosts.playvars import PlayVars
from orchestrator.hosts.runner import HostRun, TaskEvent
from orchestrator.paths import MODULES_DIR

MODULE_FILES = {p.stem: p for p in sorted(MODULES_DIR.glob("*.py"))}
#: RETURN's types, as Python has them (a nested model is a dict).
TYPES = {"str": str, "bool": bool, "int": int, "float": float, "list": list, "dict": dict}


def returned(module: str) -> dict[str, dict[str, Any]]:
    """The module's RETURN block, read from its file's text (the module is not imported)."""
    tree = ast.parse(MODULE_FILES[module].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "RETURN" for t in node.targets):
            return yaml.safe_load(ast.literal_eval(node.value))
    raise AssertionError(f"{module} has no RETURN")


def failure_only(entry: dict[str, Any]) -> bool:
    return str(entry["returned"]).startswith("failure")


def always(entry: dict[str, Any]) -> bool:
    """Returned by every success: `always`, or `success...`."""
    return str(entry["returned"]) == "always" or str(entry["returned"]).startswith("success")


def kinds(annotation: Any) -> set[type]:
    """The plain types an annotation admits, None aside: a Literal of strings is str, a model is dict."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return kinds(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(kinds(a) for a in typing.get_args(annotation)))
    if origin is Literal:
        return {type(v) for v in typing.get_args(annotation)}
    if origin in (list, dict):
        return {origin}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {dict}
    return set() if annotation is type(None) else {annotation}


def nullable(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation)


def elements(annotation: Any) -> set[type]:
    """What a list annotation holds ({} for a non-list)."""
    found: set[type] = set()
    for arm in typing.get_args(annotation) if nullable(annotation) else (annotation,):
        if typing.get_origin(arm) is list:
            found |= kinds(typing.get_args(arm)[0])
    return found


def test_every_module_has_a_model_and_every_model_a_module() -> None:
    assert set(SHAPES) == set(MODULE_FILES)


@pytest.mark.parametrize("module", sorted(MODULE_FILES))
def test_the_success_model_is_what_return_documents_both_ways(module: str) -> None:
    doc = returned(module)
    model = SHAPES[module].ok
    documented = {k for k, entry in doc.items() if not failure_only(entry)}
    assert set(model.model_fields) - documented == set(), f"{model.__name__}: fields RETURN lacks"
    assert documented - set(model.model_fields) == set(), f"{module} RETURN: keys {model.__name__} lacks"
    for name, info in model.model_fields.items():
        entry = doc[name]
        assert info.is_required() == always(entry), f"{module}.{name}: required iff returned always"
        assert kinds(info.annotation) == {TYPES[entry["type"]]}, (
            f"{module}.{name}: RETURN says {entry['type']}"
        )
        if "elements" in entry:
            assert elements(info.annotation) == {TYPES[entry["elements"]]}, f"{module}.{name}: elements"
        if nullable(info.annotation) and always(entry):
            said = str(entry["description"])
            assert "null" in said or "{}" in said, f"{module}.{name}: None accepted; RETURN never says null"


@pytest.mark.parametrize("module", sorted(MODULE_FILES))
def test_the_failure_model_takes_any_documented_field_and_only_those(module: str) -> None:
    doc = returned(module)
    ok, failed = SHAPES[module].ok, SHAPES[module].failed
    assert set(failed.model_fields) == set(doc), f"{failed.__name__}: not what {module} RETURN documents"
    assert all(not info.is_required() for info in failed.model_fields.values())
    assert {k for k in failed.model_fields if k not in ok.model_fields} == {
        k for k, e in doc.items() if failure_only(e)
    }
    for name, info in failed.model_fields.items():
        assert TYPES[doc[name]["type"]] in kinds(info.annotation), (
            f"{module}.{name}: RETURN says {doc[name]['type']}"
        )
    assert failed.model_validate({}) == failed()  # a module that failed before it knew anything


def _optional(annotation: Any) -> set[Any]:
    """The members of `annotation | None`, for comparing two unions whatever their spelling."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set(typing.get_args(annotation)) | {type(None)}
    return {annotation, type(None)}


@pytest.mark.parametrize("module", sorted(MODULE_FILES))
def test_the_failure_model_has_each_success_field_as_optional(module: str) -> None:
    """module_results.py writes the failure models out (for mypy): each field the success model has is
    there with its type or None (a failure may widen it: sglang_stop's `gpus`), and the same
    validators."""
    ok, failed = SHAPES[module].ok, SHAPES[module].failed
    for name, info in ok.model_fields.items():
        assert name in failed.model_fields, f"{failed.__name__} lacks {name}"
        theirs = failed.model_fields[name]
        assert _optional(info.annotation) <= _optional(theirs.annotation), f"{failed.__name__}.{name}"
        assert [type(m) for m in theirs.metadata] == [type(m) for m in info.metadata], (
            f"{failed.__name__}.{name}: validators"
        )
        assert theirs.default is None, f"{failed.__name__}.{name}: default"


@pytest.mark.parametrize("module", sorted(MODULE_FILES))
def test_a_whole_result_with_ansibles_keys_is_read(module: str) -> None:
    """Ansible's own keys (as real runs hand them over: tests below) are not the module's."""
    whole = result(module) | {
        "invocation": {"module_args": {}},
        "warnings": [],
        "_ansible_verbose_always": True,
    }
    assert isinstance(parse(module, whole, False), SHAPES[module].ok)


def test_a_missing_field_names_the_module_and_the_field() -> None:
    probe = result("sglang_probe")
    del probe["restart_needed"]
    with pytest.raises(ResultError) as raised:
        parse("sglang_probe", probe, False, "gpu1")
    assert str(raised.value).startswith(
        "gpu1: sglang_probe returned no 'restart_needed' (the host's module and orchestrator differ: "
        "orchestrator/hosts/module_results.py ProbeResult reads what plugins/modules/sglang_probe.py returns;"
    )


def test_an_unknown_or_renamed_field_names_the_module_and_the_field() -> None:
    probe = result("sglang_probe")
    probe["restart_required"] = probe.pop("restart_needed")
    with pytest.raises(
        ResultError,
        match=r"^gpu1: sglang_probe returned no 'restart_needed'; returned "
        r"'restart_required', which orchestrator does not know \(the host's module",
    ):
        parse("sglang_probe", probe, False, "gpu1")
    # a failure may lack any field, never have an unknown one
    with pytest.raises(ResultError, match=r"^gpu1: sglang_stop returned 'stopped_s', which orchestrator"):
        parse("sglang_stop", {"msg": "systemctl stop failed", "stopped_s": 1.0}, True, "gpu1")


def test_a_field_of_the_wrong_type_or_shape_names_its_path() -> None:
    stop = result("sglang_stop", gpus=result("gpu_idle", busy=[{"index": 0, "memory_used_mib": 9}]))
    with pytest.raises(ResultError, match=r"sglang_stop returned no 'gpus.busy.0.holders'"):
        parse("sglang_stop", stop, False, "gpu1")
    with pytest.raises(
        ResultError, match=r"sglang_probe returned 'restart_needed' as 'false': Input should be"
    ):
        parse("sglang_probe", result("sglang_probe", restart_needed="false"), False, "gpu1")
    with pytest.raises(ResultError, match=r"sglang_health_wait returned 'reason' as 'up': Input should be"):
        parse("sglang_health_wait", result("sglang_health_wait", reason="up"), True, "gpu1")


def test_a_result_a_host_wrote_is_escaped_in_the_message() -> None:
    with pytest.raises(ResultError) as raised:
        parse("sglang_units_info", result("sglang_units_info") | {"a\x1b[2Jb": 1}, False, "gpu1")
    assert "\x1b" not in str(raised.value) and "'a\\x1b[2Jb'" in str(raised.value)


def test_a_result_ansible_runner_dropped_is_said_so() -> None:
    with pytest.raises(ResultError, match=r"^gpu1: sglang_probe's result did not come back: .*MAX_EVENT_RES"):
        parse("sglang_probe", {}, False, "gpu1")


def test_a_failure_reads_what_it_knew() -> None:
    said = parse("sglang_health_wait", {"msg": "exited", "reason": "exited", "journal": ["boom"]}, True)
    assert (said.reason, said.journal, said.elapsed_s) == ("exited", ["boom"], None)
    # a missing GPU fails sglang_stop with the GPU list, gpu_idle's `gpus`
    gpu = {"index": 0, "uuid": "GPU-0", "name": "H200", "memory_used_mib": 0, "memory_total_mib": 1}
    missing = parse("sglang_stop", {"msg": "GPU 3 is not on this host", "gpus": [gpu]}, True)
    assert isinstance(missing.gpus, list) and missing.gpus[0].index == 0
    event = TaskEvent(
        "gpu1", "failed", "", "sglang_stop", {"msg": "GPU 3 is not on this host", "gpus": [gpu]}
    )
    assert readback.step_of(event) == "stop" and readback.of_run(HostRun("gpu1", [event])).gpus is None
    # a module that never ran: Ansible's keys only, and the line runner._explain_become wrote
    become = {"msg": "sudo as deploy asks for a password", "ansible_msg": "Missing sudo password"}
    assert (
        parse("sglang_probe", become | {"module_stdout": "", "module_stderr": "", "rc": 1}, True).locked
        is None
    )
    # the probe's preflight: {} is "not run"
    assert parse("sglang_probe", result("sglang_probe"), False).preflight is None


def test_facts_read_every_result_of_a_play_and_refuse_a_differing_one() -> None:
    """of_run validates each result of orchestrator's modules, even those no report reads."""
    run = HostRun("gpu1")
    run.events = [
        TaskEvent("gpu1", "ok", "", "sglang_probe", result("sglang_probe", restart_needed=True)),
        TaskEvent("gpu1", "ok", "", "ansible.builtin.debug", {"msg": "any shape"}),
        TaskEvent("gpu1", "skipped", "", "sglang_start", {}),
        TaskEvent("gpu1", "ok", "", "sglang_record", result("sglang_record")),
    ]
    assert readback.of_run(run).probe.restart_needed
    run.events[-1].result["recorded_now"] = True
    with pytest.raises(ResultError, match=r"^gpu1: sglang_record returned 'recorded_now'"):
        readback.of_run(run)


def test_a_real_play_hands_over_results_the_models_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real Ansible, on this machine: the keys it adds to a module's result (invocation, exception,
    _ansible_no_log, a delegated task's _ansible_delegated_vars) on success and on failure, and the
    results of modules that run here without root or a GPU, read through readback.of_run."""
    from orchestrator.hosts import runner

    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    paths = {key: str(tmp_path / key) for key in ("unit_dir", "state_dir", "lock_dir")}
    (tmp_path / "unit_dir").mkdir()
    books = tmp_path / "playbooks"
    books.mkdir()
    dead = "http://127.0.0.1:9"  # the discard port: nothing answers
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "vars": {"_paths": paths},
            "tasks": [
                _role("sglang_units", paths="{{ _paths }}", unit_name=""),
                _role("sglang_probe", ignore_errors=True, unit_name="x.service", paths="{{ _paths }}"),
                _role("sglang_drain", url=dead, mode="drain", timeout_s=1),
                _role("sglang_gateway", ignore_errors=True, url=dead, worker_url=dead, state="absent"),
                _role(
                    "gpu_idle", ignore_errors=True, paths="{{ _paths }}", nvidia_smi="/nonexistent/nvidia-smi"
                ),
                {
                    "name": "A bad argument",
                    "orchestrator.sglang.sglang_units_info": {"paths": "{{ _paths }}", "bogus": 1},
                    "ignore_errors": True,
                },
            ],
        }
    ]
    (books / "results.yml").write_text(json.dumps(play))
    monkeypatch.setattr(runner, "PLAYBOOKS_DIR", books)
    inv = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv.write_text(json.dumps({"all": {"hosts": {"h1": local}}}))
    run = runner.run_playbook("results.yml", inv, PlayVars()).hosts["h1"]
    ours = [(e.kind, e.action) for e in run.events if e.action in SHAPES and e.kind != "start"]
    # the probe fails where systemd does not run (a container), and reads the unit where it does
    assert ours[0] == ("ok", "sglang_units_info") and ours[1][1] == "sglang_probe"
    assert ours[2:] == [
        ("ok", "sglang_drain"),
        ("failed", "sglang_gateway"),
        ("failed", "gpu_idle"),
        ("failed", "sglang_units_info"),
    ]
    gateway = next(e for e in run.events if e.action == "sglang_gateway" and e.kind == "failed")
    assert {"invocation", "_ansible_no_log"} <= set(gateway.result)  # Ansible's, set aside
    found = readback.of_run(run)  # every one of them validated
    assert found.gpus is None and found.gateway["out"]["error"].startswith(f"gateway {dead}: ")
    assert (found.gateway["drain"]["in_flight"], found.gateway["drain"]["timed_out"]) == (0, False)


def _role(name: str, ignore_errors: bool = False, **variables: Any) -> dict[str, Any]:
    """A task importing role `name` with its variables (the role's prefix added)."""
    task: dict[str, Any] = {
        "ansible.builtin.import_role": {"name": f"orchestrator.sglang.{name}"},
        "vars": {f"{name}_{key}": value for key, value in variables.items()},
    }
    return task | ({"ignore_errors": True} if ignore_errors else {})


def test_the_results_tests_play_cover_every_module() -> None:
    """hostresults' defaults (each read above: test_a_whole_result_with_ansibles_keys_is_read)."""
    assert set(DEFAULTS) == set(SHAPES)
    # A field named as one of Ansible's keys is the module's own (module_fields keeps it).
    clashes = {
        (m, k)
        for m, shape in SHAPES.items()
        for k in shape.failed.model_fields
        if k in module_results.ANSIBLE_KEYS
    }
    assert clashes == {("sglang_unit", "diff")}
