"""A deploy to several hosts compares their model files before anything stops (issue #41): a host
whose drafter differs is named, and no deploy play starts. The comparison is a preflight play of
its own, skipped where every host already runs this very plan (nothing would stop). The lab test
(tests/lab/test_model_files.py) runs the real play; here the plays are stood in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from plays import lab_inventory

from orchestrator import ledger, paths
from orchestrator.hosts import deploy, preflight_play
from orchestrator.hosts.preflight_play import PreflightResult
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

modelfiles = paths.module_utils("orchestrator_host.modelfiles")


def scan_of(tmp_path: Path, name: str, last: bytes) -> dict[str, Any]:
    """A drafter directory's scan: one weights file whose last byte (a sampled offset) is `last`."""
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    header = b'{"w": {"dtype": "U8", "shape": [4096], "data_offsets": [0, 4096]}}'
    body = bytearray(4096)
    body[-1] = last[0]
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(body))
    return modelfiles.scan(str(d))


def test_the_host_whose_drafter_differs_is_named_with_its_file(tmp_path: Path) -> None:
    same, other = scan_of(tmp_path, "a", b"\x00"), scan_of(tmp_path, "b", b"\x01")
    results = [
        PreflightResult("lab1", True, model_files={"draft": same}),
        PreflightResult("lab2", True, model_files={"draft": same}),
        PreflightResult("lab3", True, model_files={"draft": other}),
    ]
    preflight_play.add_differences(results)
    assert [r.ok for r in results] == [True, True, False]
    (line,) = results[2].differences
    assert line.startswith("speculative.draft_model_path: lab3 differs from lab1 in ")
    assert "model.safetensors: sha256 " in line and "(whole file)" in line  # a small file: all of it
    assert results[2].problems == [line]


def test_the_odd_host_is_named_even_first_and_a_failed_scan_blames_no_other(tmp_path: Path) -> None:
    """The reference is the files most hosts have; a host whose scan failed (its own preflight says
    why) is compared with nobody."""
    same, other = scan_of(tmp_path, "a", b"\x00"), scan_of(tmp_path, "b", b"\x01")
    failed = {**same, "error": "/data/eagle3: scanning took over 30 s", "digest": ""}
    results = [
        PreflightResult("lab1", True, model_files={"draft": other}),
        PreflightResult("lab2", True, model_files={"draft": same}),
        PreflightResult("lab3", True, model_files={"draft": same}),
        PreflightResult("lab4", True, model_files={"draft": failed}),
    ]
    preflight_play.add_differences(results)
    assert [r.ok for r in results] == [False, True, True, True]
    assert results[0].differences[0].startswith("speculative.draft_model_path: lab1 differs from lab2 in ")


class Plays:
    """run_playbook stood in: which plays a deploy asked for; the files play's answer."""

    def __init__(self, differ: bool) -> None:
        self.asked: list[str] = []
        self.differ = differ

    def same_files(self, prof: Any, inventory: Path, where: dict) -> list[PreflightResult]:
        self.asked.append("preflight.yml")
        if self.differ:
            raise preflight_play.FilesDiffer("lab2: speculative.draft_model_path: lab2 differs from lab1")
        return [PreflightResult(h, True) for h in where]

    def run_playbook(self, playbook: str, *args: Any, **kwargs: Any) -> Any:
        self.asked.append(playbook)
        raise RuntimeError("stop here: the deploy play was started")


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, differ: bool) -> list[str]:
    plays = Plays(differ)
    monkeypatch.setattr(preflight_play, "require_same_files", plays.same_files)
    monkeypatch.setattr(deploy, "run_playbook", plays.run_playbook)
    inventory = lab_inventory(tmp_path)
    with pytest.raises((preflight_play.FilesDiffer, RuntimeError)):
        deploy.deploy(profile_mod.load("cg_5tok"), inventory, deploy.Options(limit="lab1,lab2"))
    return plays.asked


def test_other_files_on_one_host_stop_the_deploy_before_its_play(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert started(monkeypatch, state, differ=True) == ["preflight.yml"]


def test_same_files_go_on_to_the_deploy(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert started(monkeypatch, state, differ=False) == ["preflight.yml", "deploy.yml"]


def test_hosts_that_all_run_this_plan_skip_the_comparison(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = launch.build(profile_mod.load("cg_5tok"))
    for host in ("lab1", "lab2"):
        row = ledger.DeployRow("r", host, plan.unit_name, "cg_5tok", plan.digest, "deploy", "healthy", 1, 1)
        ledger.record_deploy(row, good_unit=plan.unit, facts={})
    assert started(monkeypatch, state, differ=True) == ["deploy.yml"]
