"""A multi-node server fails as one (deploy._group_diagnosis): every rank's report names the rank
that failed itself, not one that Ansible stopped because of it (any_errors_fatal, no failure of its
own) nor one refused at restart_lockstep.yml's ranks gate."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.hosts import deploy, playvars
from orchestrator.hosts.host_report import HostReport
from orchestrator.profile import model as profile_mod


@pytest.fixture
def where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, playvars.Placement]:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n    gpu2: {ansible_host: 10.0.0.2}\n")
    return playvars.placements(profile_mod.load("cg_5tok_2node"), inv, None)


def test_a_rank_refused_at_the_gate_is_not_the_cause(where) -> None:
    reports = [
        HostReport(host="gpu1", ok=False, step="ranks", diagnosis="failed at ranks: gpu2 will not"),
        HostReport(host="gpu2", ok=False, step="preflight", diagnosis="preflight: 1 problem(s), ..."),
    ]
    deploy._group_diagnosis(reports, where)
    assert [r.diagnosis for r in reports] == [
        "group failed: node rank 1 (gpu2) failed first: preflight: 1 problem(s), ..."
    ] * 2
    assert not any(r.ok for r in reports)


def test_a_rank_stopped_because_its_peer_failed_is_not_the_cause(where) -> None:
    """Rank 0 (gpu1) started, then Ansible ended its play when rank 1's start failed: its report
    has no failure of its own, and it sorts first."""
    reports = [
        HostReport(host="gpu1", ok=False, step="start", stopped=True),
        HostReport(host="gpu2", ok=False, step="start", diagnosis="failed at start: unit is masked"),
    ]
    deploy._group_diagnosis(reports, where)
    assert {r.diagnosis for r in reports} == {
        "group failed: node rank 1 (gpu2) failed first: failed at start: unit is masked"
    }


def test_a_group_that_did_not_fail_is_left_as_reported(where) -> None:
    reports = [
        HostReport(host="gpu1", ok=True, step="record"),
        HostReport(host="gpu2", ok=True, step="record"),
    ]
    deploy._group_diagnosis(reports, where)
    assert all(r.ok and not r.diagnosis for r in reports)
