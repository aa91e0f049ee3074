"""systemd_check: the real `systemd-analyze verify` of this machine reads each planned unit before
any host is touched (validate, render, preflight, deploy), and a line it would drop is a located
profile problem.

systemd_rules refuses every value known to be dropped, so a gap in a rule is made here by
loosening one (the Nice range): systemd-analyze itself must then catch the value.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli.main import cli
from orchestrator.errors import ProfileError
from orchestrator.hosts import deploy, preflight_play
from orchestrator.profile import model as profile_mod
from orchestrator.profile import systemd_rules
from orchestrator.render import launch, systemd_check

pytestmark = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")


@pytest.fixture
def loose_nice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule gap: Nice= takes any value on the control machine's side."""
    monkeypatch.setitem(systemd_rules.EXTRA_DIRECTIVES, "Nice", lambda value: None)


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "p.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


NICE_50 = {"extends": "cg_5tok", "service": {"extra": {"Nice": "50"}}}


def test_a_setting_systemd_drops_is_located_at_its_field(loose_nice: None, tmp_path: Path) -> None:
    prof = profile_mod.load(str(_write(tmp_path, NICE_50)))
    p = launch.build(prof)
    verdict = systemd_check.check(prof, [p])
    line = p.unit.split("\n").index("Nice=50") + 1
    assert [(x.loc, x.message) for x in verdict.problems] == [
        (
            "service.extra.Nice",
            f"systemd would not use this Nice= (unit line {line}: Nice priority out of range, ignoring: "
            "50): give a value it takes",
        )
    ]


@pytest.mark.parametrize("command", ["validate", "render"])
def test_validate_and_render_refuse_it_with_one_line(loose_nice: None, command: str, tmp_path: Path) -> None:
    path = _write(tmp_path, NICE_50)
    result = CliRunner().invoke(cli, [command, "--profile", str(path)])
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    assert line.startswith("p: service.extra.Nice: systemd would not use this Nice= (unit line ")


def test_deploy_and_preflight_refuse_it_before_any_play(
    loose_nice: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    for module in (deploy, preflight_play):
        monkeypatch.setattr(module, "run_playbook", lambda *a, **k: pytest.fail("a play ran"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n")
    prof = profile_mod.load(str(_write(tmp_path, NICE_50)))
    for run in (lambda: deploy.deploy(prof, inventory), lambda: preflight_play.preflight(prof, inventory)):
        with pytest.raises(ProfileError) as info:
            run()
        assert [p.loc for p in info.value.problems] == ["service.extra.Nice"]


def test_each_line_is_located_at_the_field_that_wrote_it() -> None:
    """Complaints about lines past validation: by directive, by variable, and a continued line by
    its first physical line (systemd numbers it by its last)."""
    prof = profile_mod.load("cg_5tok")
    p = launch.build(prof)
    unit = (
        p.unit.replace("LimitNOFILE=1048576", "LimitNOFILE=1G")
        .replace('Environment="NCCL_ALGO=Ring"', 'Environment="NCCL_ALGO=Ring')
        .replace('Environment="PYTHONUNBUFFERED=1"', 'Environment="A B=1"')
        .replace("--speculative-num-steps 3", '--speculative-num-steps "3\\q"')
        .replace("KillMode=control-group", "KillMode=bogus")
    )
    verdict = systemd_check.check(prof, [dataclasses.replace(p, unit=unit)])
    found = {x.loc: x.message for x in verdict.problems}
    lines = unit.split("\n")
    exec_start = lines.index(next(x for x in lines if x.startswith("ExecStart="))) + 1
    assert set(found) == {"service.limits.nofile", "nccl.NCCL_ALGO", "env.A B", "server", ""}, found
    assert f"ExecStart= (unit line {exec_start}: Ignoring unknown escape sequences" in found["server"]
    assert found[""].startswith("systemd would not use this KillMode= (unit line ")


def test_what_only_this_machine_lacks_does_not_count(tmp_path: Path) -> None:
    """An executable or engine missing here, an unknown user: the host's own verify judges those."""
    docs = [
        {"extends": "cg_5tok", "server": {"python": "/nonexistent/bin/python3"}},
        {"extends": "cg_5tok", "service": {"user": "nosuchuser"}},
        *(
            {
                "extends": "cg_5tok",
                "runtime": {"kind": kind, "image": "docker.io/lmsysorg/sglang:v0.5.9", "pull": "never"},
            }
            for kind in ("docker", "podman")
        ),
    ]
    for doc in docs:
        prof = profile_mod.load(str(_write(tmp_path, doc)))
        assert systemd_check.check(prof, [launch.build(prof)]) == systemd_check.Verdict(), doc


def test_one_run_per_distinct_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicas share a unit; each rank of a multi-node server has its own."""
    runs: list[str] = []
    verify = systemd_check._verify
    monkeypatch.setattr(
        systemd_check, "_verify", lambda analyze, unit, name: runs.append(unit) or verify(analyze, unit, name)
    )
    prof = profile_mod.load("cg_5tok_2node")
    ranks = [launch.build(prof, launch.Node(rank, 2, "[fd00::1]:5757")) for rank in (0, 1)]
    assert systemd_check.check(prof, [ranks[0], ranks[0], ranks[1]]) == systemd_check.Verdict()
    assert runs == [ranks[0].unit, ranks[1].unit]


def test_without_systemd_analyze_it_is_skipped_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(systemd_check.shutil, "which", lambda name: None)
    verdict = systemd_check.check(profile_mod.load("cg_5tok"), [launch.build(profile_mod.load("cg_5tok"))])
    assert verdict.problems == [] and "systemd-analyze is not installed here" in verdict.skipped
    result = CliRunner().invoke(cli, ["render", "--profile", "cg_5tok"])
    assert result.exit_code == 0 and result.stdout == launch.build(profile_mod.load("cg_5tok")).unit
    assert "note: systemd-analyze is not installed here" in result.stderr
