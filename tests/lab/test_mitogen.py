"""A team whose ansible.cfg asks for Mitogen's strategy (`strategy = mitogen_linear`) deploys with it:
the plays, the restart transaction and its Ctrl-C guard run unchanged under Mitogen's connection, and
the no-op and restart are what they are without it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from labutil import service
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

pytestmark = pytest.mark.lab

MITOGEN = importlib.util.find_spec("ansible_mitogen")


@pytest.mark.skipif(MITOGEN is None, reason="Mitogen for Ansible is not installed (the [test] extra has it)")
def test_a_deploy_under_mitogens_strategy_restarts_and_then_changes_nothing(lab, tmp_path: Path) -> None:
    assert MITOGEN is not None and MITOGEN.origin
    strategies = Path(MITOGEN.origin).parent / "plugins" / "strategy"
    (tmp_path / "ansible.cfg").write_text(
        f"[defaults]\nstrategy = mitogen_linear\nstrategy_plugins = {strategies}\n"
    )
    host = lab.hosts[1]
    argv = [sys.executable, "-m", "orchestrator", "deploy", "-i", str(lab.inventory), "--limit", host.name]
    argv += ["--profile", "example:cg_5tok", "--json"]

    def deploy(*more: str) -> dict:
        done = subprocess.run([*argv, *more], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
        report = json.loads(done.stdout)
        command = json.loads(next(Path(report["artifacts"]).glob("command")).read_text())
        assert command["env"]["ANSIBLE_CONFIG"] == str(tmp_path / "ansible.cfg")
        assert "ANSIBLE_STRATEGY" not in command["env"]  # the user's strategy, not orchestrator_linear
        return report

    restarted = deploy("--force-restart")
    (h,) = restarted["hosts"]
    assert h["ok"] and h["restarted"] and h["healthy_after_s"] is not None, h
    assert h["digest"] == launch.build(profile_mod.load("example:cg_5tok")).digest
    before = service(host)
    (again,) = deploy()["hosts"]
    assert again["ok"] and not again["changed"] and not again["restarted"], again
    assert service(host) == before
