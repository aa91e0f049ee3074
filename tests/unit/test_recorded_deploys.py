"""deploy() against recorded lab plays (plays.py): what it reports, and which plays it starts after
them: the rollback of exactly the hosts it stopped, Ctrl-C, a multi-node server failing as one, a
rollout stopped by --max-fail-percent, and a worker put back in (or reported out of) the gateway's
rotation. Each recording is named by the lab test that made it; a change to one is written here."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from plays import LAB, Gateway, Recording, Script, lab_inventory, scripted, together, variant

from orchestrator.hosts import deploy
from orchestrator.hosts.runner import TaskEvent
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

#: cg_5tok's unit: what the lab hosts ran healthy before each failing deploy.
GOOD = launch.build(profile_mod.load("cg_5tok")).digest


@pytest.fixture
def plays(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Script]:
    yield from scripted(monkeypatch, tmp_path)


@pytest.fixture
def lab(tmp_path: Path) -> Path:
    return lab_inventory(tmp_path, ghost="10.213.0.99")


def by_host(report: deploy.DeployReport) -> dict[str, deploy.HostReport]:
    return {r.host: r for r in report.hosts}


def test_a_deploy_reports_each_host_restarted_or_left_alone_and_rolls_nothing_back(lab, plays) -> None:
    """test_deploy_then_noop_changes_nothing's first deploy: each host restarted where its probe found
    the unit to change (with the probe's reasons), left alone where it already ran cg_5tok. Which
    hosts those are is the recording's (the lab's state when it ran): read from its probes."""
    recording = Recording.load("deploy_4_hosts")
    needed = {h: recording.result(h, "sglang_probe")["restart_needed"] for h in LAB}
    assert any(needed.values()) and not all(needed.values())  # both kinds, or the test proves less
    plays.then(recording)
    report = deploy.deploy(profile_mod.load("cg_5tok"), lab, deploy.Options(limit="lab1,lab2,lab3,lab4"))
    [ask] = plays.asks
    assert ask.playbook == "deploy.yml" and sorted(ask.hosts) == list(LAB) and not ask.check
    assert {ask.plan(h).digest for h in LAB} == {GOOD}
    assert {ask.plan(h).lock.run_id for h in LAB} == {report.run_id}
    assert report.ok and report.digest == GOOD and not report.interrupted
    for name, h in by_host(report).items():
        if needed[name]:
            assert h.restarted and h.changed and h.digest == GOOD and h.healthy_after_s, h
            assert h.reasons == recording.result(name, "sglang_probe")["reasons"] and h.reasons
            assert h.startup.startswith("healthy after ") and h.phases, h  # where its start went
        else:
            assert h.ok and not h.restarted and not h.stopped and h.healthy_after_s == 0.0, h
            assert h.step == "probe" and not h.startup  # the probe's end_play: the play ended there
    assert not any(h.rolled_back_to or h.rollback_error for h in report.hosts)


def test_the_same_deploy_again_changes_nothing(lab, plays) -> None:
    """test_deploy_then_noop_changes_nothing's second deploy."""
    plays.then(Recording.load("deploy_4_hosts_again"))
    report = deploy.deploy(profile_mod.load("cg_5tok"), lab, deploy.Options(limit="lab1,lab2,lab3,lab4"))
    assert report.ok and len(plays.asks) == 1
    for h in report.hosts:
        assert not h.changed and not h.restarted and not h.stopped and h.healthy_after_s == 0.0, h
        assert h.digest == GOOD and h.step == "probe"


def test_only_the_hosts_it_stopped_are_rolled_back_each_to_its_last_good_unit(lab, plays, tmp_path) -> None:
    """Four hosts of one play, each as a lab run recorded it: lab1 stopped and died of CUDA OOM
    (test_cuda_oom_from_mem_fraction), lab2 failed preflight on a busy GPU before any stop
    (test_busy_gpu_fails_...), ghost was unreachable (test_unreachable_host_...), lab4 restarted
    healthy (lab1 of test_deploy_then_noop_..., the host that run restarted). lab2, ghost and lab4
    ran other profiles there: their events
    answer this plan all the same (a probe's preflight failure, no connection, a healthy start)."""
    oom = Recording.load("oom")
    plays.then(
        together(
            oom,
            Recording.load("busy_gpu").renamed(lab2="lab1").for_any_plan("lab2"),
            Recording.load("unreachable_ghost").only("ghost").for_any_plan("ghost"),
            Recording.load("deploy_4_hosts").only("lab1").renamed(lab4="lab1").for_any_plan("lab4"),
        ),
        Recording.load("oom_rollback"),
    )
    broken = variant(tmp_path, "oom", server={"mem_fraction_static": 0.97})
    report = deploy.deploy(broken, lab, deploy.Options(limit="lab1,lab2,lab4,ghost"))
    first, back = plays.asks
    assert sorted(first.hosts) == ["ghost", "lab1", "lab2", "lab4"] and not first.rollback
    assert back.rollback and back.hosts == ["lab1"] and back.limit == "lab1"
    plan = back.plan("lab1")
    good = oom.result("lab1", "sglang_probe")["last_good"]
    assert (plan.profile, plan.digest, plan.unit) == ("cg_5tok", GOOD, good["unit"])
    assert plan.preflight is None and plan.lock.run_id == report.run_id
    hosts = by_host(report)
    assert not report.ok
    assert hosts["lab1"].diagnosis.startswith("CUDA out of memory") and hosts["lab1"].stopped
    assert hosts["lab1"].rolled_back_to == f"cg_5tok ({GOOD})"
    assert hosts["lab2"].step == "preflight" and re.search(
        r"GPU 3 is used by PID \d+ \S+ 4000 MiB", hosts["lab2"].diagnosis
    )
    assert hosts["ghost"].step == "connect" and not hosts["ghost"].stopped
    assert "10.213.0.99 port 22: No route to host" in hosts["ghost"].diagnosis
    for name in ("lab2", "ghost", "lab4"):
        assert not hosts[name].rolled_back_to and not hosts[name].rollback_error, hosts[name]
    assert hosts["lab4"].ok and hosts["lab4"].stopped and hosts["lab4"].restarted


def test_an_unreachable_host_is_reported_and_the_others_carry_on(lab, plays) -> None:
    """test_unreachable_host_is_reported_and_others_carry_on: ghost's address routes nowhere."""
    recording = Recording.load("unreachable_ghost")
    plays.then(recording)
    report = deploy.deploy(profile_mod.load("cg_5tok"), lab, deploy.Options(limit="ghost,lab2"))
    hosts = by_host(report)
    assert not report.ok and len(plays.asks) == 1  # nothing stopped: no rollback
    assert hosts["lab2"].ok and hosts["lab2"].digest == GOOD
    assert hosts["lab2"].restarted == recording.result("lab2", "sglang_probe")["restart_needed"]
    ghost = hosts["ghost"]
    assert ghost.step == "connect" and not ghost.stopped and not ghost.rollback_error
    assert ghost.diagnosis == (
        'failed at connect: Task failed: Data could not be sent to remote host "10.213.0.99". Make sure '
        "this host can be reached over ssh: ssh: connect to host 10.213.0.99 port 22: No route to host"
    )


def test_a_host_with_no_healthy_unit_recorded_is_not_rolled_back_and_says_why(lab, plays, tmp_path) -> None:
    """test_cuda_oom_from_mem_fraction's play, its probe edited to have found no last-good record (a
    host's first deploy): nothing to go back to, so no rollback play, and the report says so."""
    plays.then(Recording.load("oom").edited("lab1", "sglang_probe", last_good={}))
    broken = variant(tmp_path, "oom", server={"mem_fraction_static": 0.97})
    report = deploy.deploy(broken, lab, deploy.Options(limit="lab1"))
    [h] = report.hosts
    assert len(plays.asks) == 1
    assert h.stopped and not h.rolled_back_to
    assert h.rollback_error == "no last known good recorded for this host"


def test_max_fail_percent_reports_the_later_batches_not_started(lab, plays, tmp_path) -> None:
    """test_max_fail_percent_stops_before_touching_later_hosts: the first batch dies at its health
    wait; Ansible starts no further batch."""
    plays.then(Recording.load("max_fail_percent"), Recording.load("max_fail_percent_rollback"))
    broken = variant(tmp_path, "nomodel_all", server={"model_path": "/data/none"})
    options = deploy.Options(limit="lab1,lab2,lab3,lab4", serial="1", max_fail_percent=0, preflight=False)
    report = deploy.deploy(broken, lab, options)
    first, back = plays.asks
    assert (first.orch.serial, first.orch.max_fail_percent) == ("1", 0)
    assert back.hosts == ["lab1"] and back.plan("lab1").digest == GOOD
    hosts = by_host(report)
    assert hosts["lab1"].step == "health" and hosts["lab1"].rolled_back_to == f"cg_5tok ({GOOD})"
    for name in ("lab2", "lab3", "lab4"):
        assert hosts[name].step == "not started" and not hosts[name].rolled_back_to, hosts[name]
        assert not hosts[name].rollback_error, hosts[name]
        assert hosts[name].diagnosis == (
            "not started: an earlier batch failed past --max-fail-percent; this host was not touched"
        )


def test_one_rank_dying_fails_every_rank_naming_it_and_rolls_the_group_back(lab, plays, tmp_path) -> None:
    """test_killing_rank_1_mid_start_fails_the_group_and_rolls_it_back: rank 1 (lab3) was killed
    (signal 9) and rank 0 (lab2) exited on NCCL's 'remote process exited'. One lab run recorded
    rank 0's exit stamped 2 ms *before* rank 1's (the hosts' clocks); this recording has them the
    other way, so rank 0's stamp is moved 2 ms before rank 1's, as that run had it. The rank that
    died of its peer's death is not the cause, whatever the clocks say."""
    killed = Recording.load("two_node_rank1_killed")
    health = killed.hosts["lab2"].events[killed._last("lab2", "sglang_health_wait")]["result"]
    rank1 = killed.hosts["lab3"].events[killed._last("lab3", "sglang_health_wait")]["result"]
    died = datetime.strptime(rank1["unit_state"]["ExecMainExitTimestamp"], "%a %Y-%m-%d %H:%M:%S.%f %Z")
    before = (died - timedelta(milliseconds=2)).strftime("%a %Y-%m-%d %H:%M:%S.%f UTC")
    skewed = {**health["unit_state"], "ExecMainExitTimestamp": before}
    killed = killed.edited("lab2", "sglang_health_wait", unit_state=skewed)
    plays.then(killed, Recording.load("two_node_rank1_killed_rollback"))
    slow = variant(tmp_path, "slow_2node", extends="cg_5tok_2node", env={"SGLANG_STANDIN_LOAD_DELAY_S": "6"})
    report = deploy.deploy(slow, lab, deploy.Options(limit="lab2,lab3"))
    first, back = plays.asks
    assert first.orch.max_fail_percent == 0  # one rank failing ends every rank's play
    hosts = by_host(report)
    assert hosts["lab2"].exited_at < hosts["lab3"].exited_at  # the recorded clock order
    for name in ("lab2", "lab3"):
        assert hosts[name].diagnosis.startswith(
            "group failed: node rank 1 (lab3) failed first: killed by a signal: signal 9"
        ), hosts[name].diagnosis
    assert report.digest == "" and not report.ok
    # Each rank back on its own last good unit (a rank's unit names rank 0's address and its rank).
    assert sorted(back.hosts) == ["lab2", "lab3"]
    assert {h: back.plan(h).digest for h in back.hosts} == {
        "lab2": "de6ca1328d114c6c",
        "lab3": "15567c4f25701db7",
    }
    assert hosts["lab2"].rolled_back_to == "cg_5tok_2node (de6ca1328d114c6c)"
    assert hosts["lab3"].rolled_back_to == "cg_5tok_2node (15567c4f25701db7)"


def test_ctrl_c_marks_the_host_it_stopped_and_the_hosts_it_never_reached(lab, plays, tmp_path) -> None:
    """test_ctrl_c_mid_start_rolls_back_and_leaves_no_lock's play, here the first batch of three
    (--serial 1): Ctrl-C came during lab1's restart (the one transaction on the host: stop, start,
    its first seconds of health), before any later batch. The server was stopped there."""
    plays.then(
        Recording.load("ctrl_c_during_health").with_unreached("lab2", "lab3"),
        Recording.load("ctrl_c_during_health_rollback"),
    )
    seen: list[TaskEvent] = []
    slow = variant(tmp_path, "slow", env={"SGLANG_STANDIN_LOAD_DELAY_S": "8"})
    report = deploy.deploy(slow, lab, deploy.Options(limit="lab1,lab2,lab3", serial="1"), seen.append)
    first, back = plays.asks
    assert first.orch.serial == "1" and report.interrupted and not report.ok
    hosts = by_host(report)
    assert hosts["lab1"].diagnosis == "interrupted (Ctrl-C) during restart" and hosts["lab1"].stopped
    assert hosts["lab1"].rolled_back_to == f"cg_5tok ({GOOD})"
    for name in ("lab2", "lab3"):
        assert hosts[name].step == "not started", hosts[name]
        assert (
            hosts[name].diagnosis == "not started: interrupted (Ctrl-C) before this host; it was not touched"
        )
        assert not hosts[name].rolled_back_to and not hosts[name].rollback_error
    assert back.hosts == ["lab1"] and back.plan("lab1").digest == GOOD
    assert [(e.host, e.result["msg"]) for e in seen if e.kind == "interrupted"] == [("lab1", "rolling back")]


def test_a_second_ctrl_c_during_the_rollback_is_reported(lab, plays, tmp_path) -> None:
    """The same Ctrl-C, then one more during the rollback's own health wait: that play is answered by
    the recorded canceled play (a deploy.yml canceled at its health wait, as the rollback's would be)."""
    canceled = Recording.load("ctrl_c_during_health")
    plays.then(canceled, canceled.for_any_plan("lab1"))
    slow = variant(tmp_path, "slow", env={"SGLANG_STANDIN_LOAD_DELAY_S": "8"})
    report = deploy.deploy(slow, lab, deploy.Options(limit="lab1"))
    [h] = report.hosts
    assert report.interrupted and plays.asks[1].rollback
    assert not h.rolled_back_to
    assert h.rollback_error == "rollback interrupted (second Ctrl-C): see `status`; deploy or rollback"


@pytest.fixture
def gateway(tmp_path: Path, plays: Script, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Gateway]:
    """The lab inventory with its gateway, which lists every lab host's server as a healthy worker."""
    fake = Gateway(f"http://{address}:30000" for address in LAB.values())
    return lab_inventory(tmp_path, gateway=True), fake.install(monkeypatch, plays)


WORKER = {"lab3": "http://10.213.0.13:30000", "lab4": "http://10.213.0.14:30000"}


def test_a_failed_host_is_put_back_in_rotation_by_its_rollback(gateway, plays, tmp_path) -> None:
    """test_a_failed_profile_rolls_back_and_goes_back_into_rotation_healthy: out of rotation, drained,
    died of OOM; the rollback's play brings cg_5tok back and puts it back in rotation itself."""
    inventory, gw = gateway
    plays.then(Recording.load("gateway_oom"), Recording.load("gateway_oom_rollback"))
    broken = variant(tmp_path, "oom", server={"mem_fraction_static": 0.97})
    report = deploy.deploy(broken, inventory, deploy.Options(limit="lab3", preflight=False))
    [r] = report.hosts
    first, back = plays.asks
    assert first.plan("lab3").gateway.worker_url == WORKER["lab3"]
    assert back.rollback and back.plan("lab3").gateway.rejoin  # a canary's, benched out, goes back too
    assert r.rolled_back_to == f"cg_5tok ({GOOD})"
    assert r.gateway["out"]["changed"] and "prove" not in r.gateway  # never proven, never put back
    assert r.gateway["back"]["after"] == {"listed": True, "is_healthy": True, "load": 0}
    assert "left_out" not in r.gateway and r.gateway["url"] == "http://127.0.0.1:39000"
    assert gw.listed()[WORKER["lab3"]] is True
    assert gw.calls == [("GET", "/workers")]  # the check before the play; the plays did the rest


def test_a_failed_host_left_stopped_stays_out_of_rotation_and_says_so(gateway, plays, tmp_path) -> None:
    """The same failed play with --no-rollback: its server is down, so it is not put back."""
    inventory, gw = gateway
    plays.then(Recording.load("gateway_oom"))
    broken = variant(tmp_path, "oom", server={"mem_fraction_static": 0.97})
    report = deploy.deploy(broken, inventory, deploy.Options(limit="lab3", preflight=False, rollback=False))
    [r] = report.hosts
    assert len(plays.asks) == 1 and not r.rolled_back_to
    left = "its server was stopped and is not healthy again: deploy it, then add it back"
    assert r.gateway.get("left_out") == left, r.gateway
    assert "back" not in r.gateway and WORKER["lab3"] not in gw.listed()
    assert ("POST", "/workers") not in gw.calls


def test_ctrl_c_while_draining_puts_the_worker_back_in_rotation(gateway, plays) -> None:
    """test_ctrl_c_while_draining_puts_the_worker_back_in_rotation: out of rotation, Ctrl-C during the
    drain, before the stop. The rollback's play finds the server healthy on its unit and ends there
    (recorded), so orchestrator itself puts the worker back."""
    inventory, gw = gateway
    plays.then(Recording.load("gateway_ctrl_c_draining"), Recording.load("gateway_ctrl_c_draining_rollback"))
    options = deploy.Options(limit="lab4", force_restart=True, drain_timeout_s=120)
    report = deploy.deploy(profile_mod.load("cg_5tok"), inventory, options)
    [r] = report.hosts
    back = plays.asks[1]
    assert report.interrupted and r.diagnosis == "interrupted (Ctrl-C) during drain" and not r.stopped
    # After Ctrl-C even the plan's own unit may be what the host needs back.
    assert back.rollback and back.plan("lab4").digest == GOOD and r.rolled_back_to == f"cg_5tok ({GOOD})"
    assert r.gateway["out"]["changed"] and "left_out" not in r.gateway
    assert r.gateway.get("back") == {
        "changed": True,
        "before": {"listed": False},
        "after": {"listed": True, "is_healthy": True, "load": 0},
    }
    assert ("POST", "/workers") in gw.calls and gw.listed()[WORKER["lab4"]] is True


def test_a_worker_the_gateway_will_not_take_back_is_reported_left_out(gateway, plays, monkeypatch) -> None:
    """The same Ctrl-C, and the gateway refuses the worker back (its health check fails)."""
    inventory, gw = gateway
    gw.refuse_add = True
    plays.then(Recording.load("gateway_ctrl_c_draining"), Recording.load("gateway_ctrl_c_draining_rollback"))
    options = deploy.Options(limit="lab4", force_restart=True, drain_timeout_s=120)
    report = deploy.deploy(profile_mod.load("cg_5tok"), inventory, options)
    [r] = report.hosts
    assert r.gateway.get("left_out", "").startswith(
        "the gateway did not take it back healthy: POST http://127.0.0.1:39000/workers: 503"
    ), r.gateway
    assert "back" not in r.gateway and WORKER["lab4"] not in gw.listed()
