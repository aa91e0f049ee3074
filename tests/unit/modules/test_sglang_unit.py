"""roles/sglang_unit: secret, unit (verified by the real systemd-analyze) and facts in one step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ansible.module_utils.orchestrator_host import unit_digest
from hostfakes import load_module

pytestmark = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")

UNIT = "# profile: llama-8b\n[Unit]\nDescription=SGLang\n[Service]\nExecStart=/bin/true\n"
FACTS = {
    "profile": "llama-8b",
    "port": 30000,
    "bind": "0.0.0.0",
    "gpus": [0],
    "health_url": "http://x/health",
}


@pytest.fixture
def sglang_unit():
    return load_module("sglang_unit", "sglang_unit")


@pytest.fixture
def args(paths: dict) -> dict:
    secret = str(Path(paths["state_dir"]) / "llama-8b.config.yaml")
    return {
        "unit_name": "sglang.service",
        "paths": paths,
        "content": UNIT,
        "facts": FACTS,
        "secret_path": secret,
        "secret_content": "api-key: s3cret\n",
    }


def mode(path: str | Path) -> int:
    return Path(path).stat().st_mode & 0o777


def test_writes_secret_unit_and_facts_then_changes_nothing(sglang_unit, args, paths, run_module):
    failed, result = run_module(sglang_unit, args)
    assert not failed and result["changed"]
    unit = Path(paths["unit_dir"], "sglang.service")
    assert result["digest"] == unit_digest(UNIT.encode()) and result["unit_path"] == str(unit)
    assert unit.read_text() == UNIT and mode(unit) == 0o644
    assert mode(paths["state_dir"]) == 0o700
    assert Path(args["secret_path"]).read_text() == "api-key: s3cret\n" and mode(args["secret_path"]) == 0o600
    facts = Path(paths["state_dir"], "units", "sglang.service.json")
    assert json.loads(facts.read_text()) == {**FACTS, "digest": result["digest"]} and mode(facts) == 0o600
    assert sorted(p.name for p in Path(paths["unit_dir"]).iterdir()) == ["sglang.service"]
    assert "diff" not in result
    failed, again = run_module(sglang_unit, args)
    assert not failed and again["changed"] is False


def test_a_unit_systemd_refuses_changes_no_file(sglang_unit, args, paths, run_module):
    run_module(sglang_unit, args)
    bad = UNIT.replace("/bin/true", "/nonexistent/sglang")
    failed, result = run_module(sglang_unit, {**args, "content": bad, "secret_content": "api-key: new\n"})
    assert failed
    assert result["msg"].startswith("systemd-analyze verify refused sglang.service: ")
    assert "/nonexistent/sglang" in result["msg"]
    assert Path(paths["unit_dir"], "sglang.service").read_text() == UNIT
    assert Path(args["secret_path"]).read_text() == "api-key: s3cret\n"
    facts = json.loads(Path(paths["state_dir"], "units", "sglang.service.json").read_text())
    assert facts["digest"] == unit_digest(UNIT.encode())
    assert sorted(p.name for p in Path(paths["unit_dir"]).iterdir()) == ["sglang.service"]


def test_a_line_systemd_ignores_changes_no_file(sglang_unit, args, paths, run_module):
    """systemd-analyze verify exits 0 on it, and the unit would start without the setting."""
    run_module(sglang_unit, args)
    bad = UNIT + "Nice=50\nLimitNOFILE=1G\n"
    failed, result = run_module(sglang_unit, {**args, "content": bad, "secret_content": "api-key: new\n"})
    assert failed
    assert result["msg"] == (
        "systemd-analyze verify refused sglang.service: sglang.service:6: Nice priority out of range, "
        "ignoring: 50; sglang.service:7: Failed to parse resource value, ignoring: 1G"
    )
    assert Path(paths["unit_dir"], "sglang.service").read_text() == UNIT
    assert Path(args["secret_path"]).read_text() == "api-key: s3cret\n"
    assert sorted(p.name for p in Path(paths["unit_dir"]).iterdir()) == ["sglang.service"]


def test_check_mode_writes_nothing_and_diff_mode_shows_the_unit(sglang_unit, args, paths, run_module):
    failed, result = run_module(sglang_unit, args, check_mode=True, diff=True)
    assert not failed and result["changed"]
    assert result["diff"] == {
        "before_header": str(Path(paths["unit_dir"], "sglang.service")),
        "after_header": str(Path(paths["unit_dir"], "sglang.service")),
        "before": "",
        "after": UNIT,
    }
    assert list(Path(paths["unit_dir"]).iterdir()) == [] and not Path(paths["state_dir"]).exists()


def test_a_changed_mode_or_fact_is_a_change(sglang_unit, args, paths, run_module):
    run_module(sglang_unit, args)
    Path(paths["unit_dir"], "sglang.service").chmod(0o600)
    failed, result = run_module(sglang_unit, args)
    assert result["changed"] and mode(Path(paths["unit_dir"], "sglang.service")) == 0o644
    failed, result = run_module(sglang_unit, {**args, "facts": {**FACTS, "port": 30001}})
    assert not failed and result["changed"]


def test_the_secret_never_shows_in_the_result(sglang_unit, args, run_module):
    failed, result = run_module(sglang_unit, args, diff=True)
    assert not failed and "s3cret" not in json.dumps(result)
