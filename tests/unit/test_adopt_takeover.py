"""A deploy after `adopt`: the ledger's pending adoption becomes the host's takeover, and after the
play the adoption says what became of the hand-started server. Where the unit failed, the hand
command starts again (adopt_play.relaunch), never the last good unit, and the next deploy takes
over the process that runs then."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator import ledger
from orchestrator.errors import InputError
from orchestrator.hosts import adopt_play, deploy, playvars
from orchestrator.hosts.host_report import DeployReport, HostReport
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n    gpu2: {ansible_host: 10.0.0.2}\n")
    return inv


def adopted(
    host: str, pid: int = 4242, ticks: int = 777, profile: str = "cg_5tok", command: dict | None = None
) -> None:
    said = {"argv": ["python3", "-m", "sglang.launch_server"], "cwd": "/", "user": "root", "log": "/x.log"}
    command = {**said, **(command or {})}
    ledger.record_adoption(
        {
            "host": host,
            "unit_name": "sglang.service",
            "profile": profile,
            "pid": pid,
            "start_ticks": ticks,
            "port": 30000,
            "command": json.dumps(command),
            "state": "pending",
        }
    )


def plans(inventory: Path) -> dict[str, playvars.HostPlan]:
    prof = profile_mod.load("cg_5tok")
    where = playvars.placements(prof, inventory, None)
    return deploy.play_vars(prof, where, deploy.Options(), "r1").hosts


def test_a_pending_adoption_is_the_hosts_takeover_and_preflight_knows_its_pid(inventory: Path) -> None:
    assert all(hp.takeover is None for hp in plans(inventory).values())
    adopted("gpu1")
    hosts = plans(inventory)
    assert hosts["gpu1"].takeover == playvars.Takeover(pid=4242, start_ticks=777)
    assert hosts["gpu1"].preflight is not None and hosts["gpu1"].preflight.takeover_pid == 4242
    assert hosts["gpu2"].takeover is None and hosts["gpu2"].preflight.takeover_pid == 0
    row = ledger.pending_adoption("gpu1", "sglang.service")
    ledger.update_adoption(row["id"], "taken")
    assert plans(inventory)["gpu1"].takeover is None  # taken over once: never again


def test_only_the_adopted_profile_takes_the_server_over(inventory: Path) -> None:
    """Another profile of the same unit does not run what the hand-started server runs: its
    deploy stops nothing it was not asked to (preflight then names the port's holder)."""
    adopted("gpu1", profile="hand")
    assert plans(inventory)["gpu1"].takeover is None
    assert ledger.pending_adoption("gpu1", "sglang.service") is not None


def report(*hosts: HostReport) -> DeployReport:
    return DeployReport("cg_5tok", "d", False, list(hosts), ".", "r1")


def test_after_a_good_takeover_the_adoption_is_taken_or_gone(inventory: Path) -> None:
    adopted("gpu1")
    adopted("gpu2", pid=99)
    taken = plans(inventory)
    ok = HostReport("gpu1", True, "record", takeover={"taken": True, "pid": 4242})
    gone = HostReport("gpu2", True, "record", takeover={"taken": False, "why": "PID 99 has exited"})
    deploy._after_takeover(report(ok, gone), inventory, taken, None, relaunch=True)
    assert ledger.pending_adoption("gpu1", "sglang.service") is None
    states = {r["host"]: r["state"] for r in ledger._select("adoptions", "SELECT * FROM adoptions")}
    assert states == {"gpu1": "taken", "gpu2": "gone"}


def test_a_failed_unit_starts_the_hand_command_again_and_the_next_deploy_takes_that(
    inventory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adopted("gpu1")
    taken = plans(inventory)
    asked: list[dict[str, Any]] = []

    def relaunch(inv: Path, hosts: dict[str, playvars.Relaunch], on_event: Any = None) -> dict:
        asked.append(hosts)
        return {
            "gpu1": {"action": "relaunch", "pid": 5150, "start_ticks": 900, "healthy": True, "log": "/x.log"}
        }

    monkeypatch.setattr(adopt_play, "relaunch", relaunch)
    failed = HostReport("gpu1", False, "health", stopped=True, takeover={"taken": True, "pid": 4242})
    failed.rollback_error = "no last known good recorded for this host"
    deploy._after_takeover(report(failed), inventory, taken, None, relaunch=True)
    [hosts] = asked
    assert hosts["gpu1"].unit_name == "sglang.service"
    assert hosts["gpu1"].health_url == taken["gpu1"].facts.health_url
    assert hosts["gpu1"].health_timeout_s == max(taken["gpu1"].health_timeout_s, deploy.RELAUNCH_S)
    assert failed.relaunched["pid"] == 5150 and failed.rollback_error == ""
    assert failed.rolled_back_to == "the hand command, started again (PID 5150)"
    again = ledger.pending_adoption("gpu1", "sglang.service")
    assert (again["pid"], again["start_ticks"], again["profile"]) == (5150, 900, "cg_5tok")
    assert plans(inventory)["gpu1"].takeover == playvars.Takeover(pid=5150, start_ticks=900)


def test_a_relaunch_that_fails_is_said_and_no_rollback_restores_a_unit_over_it(
    inventory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adopted("gpu1")
    taken = plans(inventory)
    monkeypatch.setattr(
        adopt_play, "relaunch", lambda *a, **k: {"gpu1": {"healthy": False, "error": "it exited: see /x.log"}}
    )
    failed = HostReport("gpu1", False, "health", stopped=True, takeover={"taken": True, "pid": 4242})
    rolled: list[list[str]] = []
    monkeypatch.setattr(
        deploy, "rollback_hosts", lambda inv, broken, *a, **k: rolled.append([r.host for r in broken])
    )
    deploy._roll_back(report(failed), inventory, taken, "sglang.service", None)
    assert rolled == [[]]  # the hand-started server comes back as it was, not as a unit
    deploy._after_takeover(report(failed), inventory, taken, None, relaunch=True)
    assert failed.rollback_error == "the hand command did not start again: it exited: see /x.log"
    assert ledger.pending_adoption("gpu1", "sglang.service") is not None


def test_with_no_rollback_nothing_is_started_again(inventory: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    adopted("gpu1")
    taken = plans(inventory)
    monkeypatch.setattr(adopt_play, "relaunch", lambda *a, **k: pytest.fail("--no-rollback relaunched"))
    failed = HostReport("gpu1", False, "health", stopped=True, takeover={"taken": True, "pid": 4242})
    deploy._after_takeover(report(failed), inventory, taken, None, relaunch=False)
    assert failed.relaunched == {}


def test_a_restart_cut_off_after_the_takeover_still_brings_the_hand_server_back(
    inventory: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C or a lost connection during the restart: the step's result never came back, so the
    report has no takeover; the host still owes its hand-started server, never a unit."""
    adopted("gpu1")
    taken = plans(inventory)
    asked: list[dict[str, playvars.Relaunch]] = []

    def relaunch(inv: Path, hosts: dict[str, playvars.Relaunch], on_event: Any = None) -> dict:
        asked.append(hosts)
        return {"gpu1": {"pid": 4242, "start_ticks": 777, "healthy": True}}  # it was never stopped

    monkeypatch.setattr(adopt_play, "relaunch", relaunch)
    cut = HostReport("gpu1", False, "restart", stopped=True)
    rolled: list[list[str]] = []
    monkeypatch.setattr(
        deploy, "rollback_hosts", lambda inv, broken, *a, **k: rolled.append([r.host for r in broken])
    )
    cut_report = report(cut)
    cut_report.interrupted = True
    deploy._roll_back(cut_report, inventory, taken, "sglang.service", None)
    deploy._after_takeover(cut_report, inventory, taken, None, relaunch=True)
    assert rolled == [[]]
    [hosts] = asked
    assert (hosts["gpu1"].pid, hosts["gpu1"].start_ticks) == (4242, 777)
    assert hosts["gpu1"].gpus == taken["gpu1"].facts.gpus
    assert cut.rolled_back_to == "the hand-started server, never stopped (PID 4242)"


def test_a_profile_edited_to_run_something_else_takes_nothing_over(inventory: Path) -> None:
    """adopt records what its profile renders; an edit of a flag or a variable is another
    command, so a deploy of it stops nothing it was not proved equal to."""
    prof = profile_mod.load("cg_5tok")
    proved = adopt_play.command_digest(launch.build(prof))
    adopted("gpu1", command={"digest": proved})
    assert plans(inventory)["gpu1"].takeover is not None
    row = ledger.pending_adoption("gpu1", "sglang.service")
    ledger.update_adoption(row["id"], "gone")
    adopted("gpu1", command={"digest": "0123456789abcdef"})
    assert plans(inventory)["gpu1"].takeover is None


def test_a_secret_file_that_changed_since_adopt_stops_the_deploy_before_anything(
    inventory: Path, tmp_path: Path
) -> None:
    key = tmp_path / "key"
    key.write_text("the-new-key\n")
    key.chmod(0o600)
    prof = profile_mod.Profile.model_validate(
        {**profile_mod.load("cg_5tok").model_dump(exclude_unset=True), "api_key": {"file": str(key)}}
    )
    held = {"--api-key": hashlib.sha256(b"the-old-key").hexdigest()}
    adopted("gpu1", command={"secrets": held})
    where = playvars.placements(prof, inventory, None)
    hosts = deploy.play_vars(prof, where, deploy.Options(), "r1").hosts
    with pytest.raises(InputError, match=r"gpu1: .*key does not hold the --api-key the server runs with"):
        deploy.check_takeover_secrets(prof, hosts)
    key.write_text("the-old-key\n")
    deploy.check_takeover_secrets(prof, hosts)
