"""deploy --canary against recorded lab plays (plays.py): the rest of the fleet starts only after
the canary's deploy is healthy and its bench held up. The benches' numbers are the test's (bench.run
measures a live server; what it measured in the lab is in the test's docstring), every play is a
recording."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from plays import LAB, Gateway, Recording, Script, lab_inventory, scripted, variant

from orchestrator.cli.main import cli
from orchestrator.hosts import deploy
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch
from orchestrator.tuning import bench, canary

GOOD = launch.build(profile_mod.load("cg_5tok")).digest


@pytest.fixture
def plays(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Script]:
    yield from scripted(monkeypatch, tmp_path)


@dataclass
class Benches:
    """bench.run's stand-in: answers with `tok_s` in order, and keeps each target it was given."""

    tok_s: list[float] = field(default_factory=list)
    targets: list[bench.Target] = field(default_factory=list)

    def run(self, target: bench.Target, settings: bench.Settings) -> SimpleNamespace:
        self.targets.append(target)
        return SimpleNamespace(tok_s=SimpleNamespace(mean=self.tok_s.pop(0)))


@pytest.fixture
def benches(monkeypatch: pytest.MonkeyPatch) -> Benches:
    found = Benches()
    monkeypatch.setattr(bench, "run", found.run)
    monkeypatch.setattr(bench, "record", lambda result, sweep_id="": 0)  # no ledger row of a stand-in
    return found


def deploys(plays: Script) -> list[tuple[str, ...]]:
    """The hosts of each deploy.yml play asked for, in order."""
    return [tuple(a.hosts) for a in plays.asks if a.playbook == "deploy.yml"]


def test_a_canary_whose_deploy_fails_is_rolled_back_and_no_other_host_starts(
    plays, benches, tmp_path
) -> None:
    """The canary (lab1) benched on cg_5tok (test_status_and_stop's status play), then its deploy
    dies of CUDA OOM and is rolled back (test_cuda_oom_from_mem_fraction's plays)."""
    plays.then(Recording.load("status_lab1_cg_5tok"), Recording.load("oom"), Recording.load("oom_rollback"))
    benches.tok_s.append(90.0)
    broken = variant(tmp_path, "oom", server={"mem_fraction_static": 0.97})
    inventory = lab_inventory(tmp_path)
    found, report = canary.canary_deploy(
        broken, inventory, deploy.Options(limit="lab1,lab2,lab3"), 0.05, bench.Settings()
    )
    assert not found.accepted and found.reason == "the canary deploy failed"
    assert (found.host, found.before_tok_s, found.after_tok_s) == ("lab1", 90.0, None)
    assert [t.host for t in benches.targets] == ["lab1"]  # never benched after
    assert [a.playbook for a in plays.asks] == ["status.yml", "deploy.yml", "deploy.yml"]
    assert deploys(plays) == [("lab1",), ("lab1",)] and plays.asks[2].rollback
    assert [h.host for h in report.hosts] == ["lab1"] and report.hosts[
        0
    ].rolled_back_to == f"cg_5tok ({GOOD})"
    assert not any(h in a.hosts for a in plays.asks for h in ("lab2", "lab3"))


def test_a_slower_canary_is_rolled_back_and_the_fleet_stays_on_the_old_profile(
    plays, benches, tmp_path
) -> None:
    """test_a_slower_canary_is_rejected_and_the_fleet_stays_on_the_old_profile, every play of it:
    the fleet on baseline, then `deploy --canary` as the user runs it: the canary's bench, its deploy
    of eagle3_16tok_nocg, its bench again, and `rollback` of it (status, then the recorded baseline
    unit back). 90 and 53.2 tok/s are the stand-in server's model of those two profiles, which the
    lab's benches measured."""
    plays.then(
        Recording.load("canary_fleet_on_baseline"),
        Recording.load("canary_status_before"),
        Recording.load("canary_deploy"),
        Recording.load("canary_status_after"),
        Recording.load("canary_rollback_status"),
        Recording.load("canary_rollback"),
    )
    inventory = lab_inventory(tmp_path)
    fleet = "lab2,lab3,lab4"
    assert deploy.deploy(profile_mod.load("baseline"), inventory, deploy.Options(limit=fleet)).ok
    benches.tok_s.extend([90.0, 53.2])
    argv = ["deploy", "-i", str(inventory), "--limit", fleet, "-p", "eagle3_16tok_nocg", "--canary", "--json"]
    done = CliRunner().invoke(cli, argv)
    assert done.exit_code == 1, done.output
    why = (
        "53.2 tok/s is more than 5% below the previous 90.0 tok/s; canary rolled back, no other host touched"
    )
    assert f"canary lab2: 90.0 -> 53.2 tok/s: REJECTED: {why}" in done.stderr
    [host] = json.loads(done.stdout)["hosts"]
    assert host["host"] == "lab2" and host["diagnosis"] == f"canary rejected: {why}"
    assert deploys(plays) == [("lab2", "lab3", "lab4"), ("lab2",), ("lab2",)]
    canary_play, back = plays.asks[2], plays.asks[5]
    assert canary_play.plan("lab2").digest == launch.build(profile_mod.load("eagle3_16tok_nocg")).digest
    baseline = launch.build(profile_mod.load("baseline")).digest
    assert back.rollback and back.plan("lab2").digest == baseline and back.plan("lab2").profile == "baseline"
    # Benched on what status read there: baseline before, the canary's unit after.
    assert [(t.host, t.profile) for t in benches.targets] == [
        ("lab2", "baseline"),
        ("lab2", "eagle3_16tok_nocg"),
    ]


def test_an_accepted_canary_goes_back_in_rotation_before_the_rest_roll(
    plays, benches, tmp_path, monkeypatch
) -> None:
    """test_a_canary_is_benched_out_of_rotation_and_put_back, every play of it: the canary (lab2)
    out of the gateway's rotation and drained, benched, deployed (staying out), benched, put back; only
    then the other host (lab3), which the play itself takes out and puts back."""
    gw = Gateway(f"http://{address}:30000" for address in LAB.values()).install(monkeypatch, plays)
    plays.then(
        Recording.load("gateway_canary_status_out"),
        Recording.load("gateway_canary_status_before"),
        Recording.load("gateway_canary_deploy"),
        Recording.load("gateway_canary_status_after"),
        Recording.load("gateway_canary_rest"),
    )
    benches.tok_s.extend([90.0, 90.0])
    inventory = lab_inventory(tmp_path, gateway=True)
    options = deploy.Options(limit="lab2,lab3", force_restart=True)
    found, report = canary.canary_deploy(
        profile_mod.load("cg_5tok"), inventory, options, 0.05, bench.Settings()
    )
    assert found.accepted and found.reason == "tok/s held up"
    assert deploys(plays) == [("lab2",), ("lab3",)]
    assert not plays.asks[2].plan("lab2").gateway.rejoin  # benched out of rotation: canary.py puts it back
    assert plays.asks[4].plan("lab3").gateway.rejoin
    # Out (DELETE) before the canary's play, back (POST) before the rest's: both by canary.py.
    own = [c for c in gw.calls if c[0] != "GET"]
    assert own == [("DELETE", "/workers/w1"), ("POST", "/workers")]
    assert gw.listed() == {f"http://{address}:30000": True for address in LAB.values()}
    assert [h.host for h in report.hosts] == ["lab2", "lab3"] and report.ok
