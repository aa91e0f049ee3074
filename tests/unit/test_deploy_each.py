"""deploy(each=...): several trials in one play, one profile per host (a tune campaign), and the
campaign's lock (Options.lock_id, keep_lock, lock_profile) carried by the deploy and its rollback.
What would not fit one play is refused before any play runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hostresults import result

from orchestrator.errors import InputError
from orchestrator.hosts import deploy, playvars, rollback
from orchestrator.hosts.host_report import HostReport
from orchestrator.hosts.playvars import PlayVars
from orchestrator.hosts.runner import HostRun, PlayResult, TaskEvent
from orchestrator.profile import model as profile_mod
from orchestrator.render import launch


class Played(Exception):
    """Raised by the stand-in play once it has seen what deploy() hands to Ansible."""


@pytest.fixture
def inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  hosts:\n    gpu1: {ansible_host: 10.0.0.1}\n    gpu2: {ansible_host: 10.0.0.2}\n"
        "  children:\n    rack: {hosts: {gpu1: {}, gpu2: {}}}\n"
    )
    return inv


@pytest.fixture
def plays(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Each play deploy() would run (playbook, orch, limit, secret), none of them run."""
    seen: list[dict[str, Any]] = []

    def run_playbook(name: str, inventory: Path, orch: PlayVars, **kw: Any) -> PlayResult:
        seen.append({"name": name, "orch": orch, **kw})
        raise Played

    monkeypatch.setattr(deploy, "run_playbook", run_playbook)
    return seen


def load(name: str) -> profile_mod.Profile:
    return profile_mod.load(name)


def written(tmp_path: Path, name: str, text: str) -> profile_mod.Profile:
    path = tmp_path / f"{name}.yml"
    path.write_text(text)
    return profile_mod.load(str(path))


def test_each_host_gets_its_own_profiles_unit_in_one_play(inventory: Path, plays: list) -> None:
    five, sixteen = load("cg_5tok"), load("cg_16tok")
    with pytest.raises(Played):
        deploy.deploy(five, inventory, each={"gpu2": sixteen, "gpu1": five})
    [play] = plays
    hosts = play["orch"].hosts
    assert play["name"] == "deploy.yml" and play["limit"] == "gpu2,gpu1"
    assert hosts["gpu1"].unit == launch.build(five).unit and hosts["gpu1"].profile == "cg_5tok"
    assert hosts["gpu2"].unit == launch.build(sixteen).unit and hosts["gpu2"].profile == "cg_16tok"
    assert hosts["gpu1"].digest != hosts["gpu2"].digest
    assert "--speculative-num-draft-tokens 16" in hosts["gpu2"].unit
    assert "--speculative-num-draft-tokens 5" in hosts["gpu1"].unit
    # Each host's preflight checks its own unit and flags.
    assert hosts["gpu2"].preflight.unit_content == hosts["gpu2"].unit
    # The run is named by `prof`; one lock for the play.
    assert hosts["gpu1"].lock == hosts["gpu2"].lock and hosts["gpu1"].lock.profile == "cg_5tok"


def test_the_lock_lasts_as_long_as_the_slowest_trial_may_take(inventory: Path, tmp_path: Path) -> None:
    slow = written(tmp_path, "slow", "extends: cg_5tok\nservice: {health_timeout_s: 7200}\n")
    fast = load("cg_16tok")
    where = {"gpu1": playvars.placements(fast, inventory, "gpu1")["gpu1"]}
    where["gpu2"] = playvars.placements(slow, inventory, "gpu2")["gpu2"]
    orch = deploy.play_vars(fast, where, deploy.Options(), "r1", {"gpu1": fast, "gpu2": slow})
    svc = slow.service
    assert (
        orch.hosts["gpu1"].lock.ttl_s == playvars.READ_AHEAD_TIMEOUT_S + svc.stop_timeout_s + 60 + 7200 + 120
    )
    assert (orch.hosts["gpu1"].health_timeout_s, orch.hosts["gpu2"].health_timeout_s) == (1800, 7200)


def test_with_each_the_report_carries_no_single_digest(
    inventory: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each host runs its own plan (its HostReport has its digest); the same deploy without each
    reports the profile's, on the hosts of --limit (none given: all)."""
    played: list[str | None] = []

    def run_playbook(name: str, inventory: Path, orch: PlayVars, **kw: Any) -> PlayResult:
        played.append(kw["limit"])
        return PlayResult(0, "successful", {}, tmp_path)

    monkeypatch.setattr(deploy, "run_playbook", run_playbook)
    five = load("cg_5tok")
    checked = deploy.Options(check=True)
    assert deploy.deploy(five, inventory, checked).digest == launch.build(five).digest
    assert deploy.deploy(five, inventory, checked, each={"gpu1": five, "gpu2": load("cg_16tok")}).digest == ""
    assert played == [None, "gpu1,gpu2"]


@pytest.mark.parametrize(
    ("each", "options", "message"),
    [
        ({"gpu1": "cg_5tok"}, {"limit": "gpu1"}, r"each names the hosts \(--limit gpu1 was given too\)"),
        ({"gpu1": "cg_5tok", "gpu9": "cg_5tok"}, {}, r"each: gpu9: not a host of .*hosts.yml \(give host"),
        ({"rack": "cg_5tok"}, {}, r"each: rack: not a host of"),
        ({}, {}, r"each names no host: map each host to its trial's profile"),
        (
            {"gpu1": "cg_5tok", "gpu2": "cg_5tok_2node"},
            {},
            r"each: gpu2: cg_5tok_2node would be a multi-node server \(deployment.kind is multinode\), and a "
            r"multi-node server cannot be one of several trials",
        ),
    ],
)
def test_what_one_play_of_trials_cannot_carry_is_refused_before_any_play(
    inventory: Path, plays: list, each: dict, options: dict, message: str
) -> None:
    with pytest.raises(InputError, match=message):
        deploy.deploy(
            load("cg_5tok"), inventory, deploy.Options(**options), each={h: load(p) for h, p in each.items()}
        )
    assert plays == []


def test_a_host_the_inventory_makes_multinode_cannot_be_a_trial(inventory: Path, plays: list) -> None:
    inventory.write_text(
        inventory.read_text().replace("10.0.0.2}", "10.0.0.2, orchestrator_deployment: multinode}")
    )
    five = load("cg_5tok")
    with pytest.raises(
        InputError, match=r"each: gpu2: cg_5tok would be a multi-node server \(the host's orch"
    ):
        deploy.deploy(five, inventory, each={"gpu1": five, "gpu2": five})
    assert plays == []


@pytest.mark.parametrize(
    ("mine", "theirs", "what"),
    [
        ("api_key: {env: ORCH_TEST_KEY}\n", "api_key: {env: ORCH_TEST_OTHER_KEY}\n", "api_key"),
        ("", "secret_env: {HF_TOKEN: {env: ORCH_TEST_KEY}}\n", "source variables (api_key.env, secret_env)"),
        (
            "secret_env: {HF_TOKEN: {env: ORCH_TEST_KEY}}\n",
            "secret_env: {HF_HUB_TOKEN: {env: ORCH_TEST_KEY}}\n",
            "secret_env or service.environment_files",
        ),
    ],
)
def test_trials_may_not_vary_secrets(
    inventory: Path,
    plays: list,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mine: str,
    theirs: str,
    what: str,
) -> None:
    """The play carries one set of secrets, prof's: a trial with others would run without its own."""
    monkeypatch.setenv("ORCH_TEST_KEY", "k" * 32)
    monkeypatch.setenv("ORCH_TEST_OTHER_KEY", "o" * 32)
    keyed = written(tmp_path, "keyed", "extends: cg_5tok\n" + mine)
    other = written(tmp_path, "other", "extends: cg_16tok\n" + theirs)
    with pytest.raises(InputError) as info:
        deploy.deploy(keyed, inventory, each={"gpu1": keyed, "gpu2": other})
    assert str(info.value) == (
        f"each: gpu2: other's {what} differ from keyed's: trials may not vary secrets; give every trial "
        "the same ones"
    )
    assert "k" * 32 not in str(info.value) and "o" * 32 not in str(info.value)
    assert plays == []


def test_the_same_key_from_another_variable_is_no_difference_in_secrets_but_in_where_they_come_from(
    inventory: Path, plays: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The play hides prof's variables from Ansible's environment: a trial reading its key from
    another variable would leave that one in the run's artifacts."""
    monkeypatch.setenv("ORCH_TEST_KEY", "k" * 32)
    monkeypatch.setenv("ORCH_TEST_SAME_KEY", "k" * 32)
    keyed = written(tmp_path, "keyed", "extends: cg_5tok\napi_key: {env: ORCH_TEST_KEY}\n")
    same = written(tmp_path, "same", "extends: cg_16tok\napi_key: {env: ORCH_TEST_SAME_KEY}\n")
    with pytest.raises(
        InputError,
        match=r"each: gpu2: same's source variables \(api_key\.env, secret_env\) differ from keyed's",
    ):
        deploy.deploy(keyed, inventory, each={"gpu1": keyed, "gpu2": same})
    ok = written(tmp_path, "ok", "extends: cg_16tok\napi_key: {env: ORCH_TEST_KEY}\n")
    with pytest.raises(Played):
        deploy.deploy(keyed, inventory, each={"gpu1": keyed, "gpu2": ok})
    assert plays[0]["hide_env"] == ["ORCH_TEST_KEY"]


def test_trials_deploy_one_unit_name(inventory: Path, plays: list, tmp_path: Path) -> None:
    renamed = written(tmp_path, "renamed", "extends: cg_16tok\nservice: {unit_name: sglang-b.service}\n")
    with pytest.raises(
        InputError, match=r"each: gpu2: renamed's service\.unit_name sglang-b\.service is not"
    ):
        deploy.deploy(load("cg_5tok"), inventory, each={"gpu1": load("cg_5tok"), "gpu2": renamed})
    assert plays == []


def test_a_campaigns_deploys_take_its_lock_and_keep_it(inventory: Path, plays: list) -> None:
    five = load("cg_5tok")
    campaign = deploy.Options(lock_id="camp1", keep_lock=True, lock_profile="tune campaign camp1")
    with pytest.raises(Played):
        deploy.deploy(five, inventory, campaign, each={"gpu1": five, "gpu2": load("cg_16tok")})
    with pytest.raises(Played):
        deploy.deploy(five, inventory, deploy.Options(limit="gpu1"))
    lock = plays[0]["orch"].extravars()["orch"]["hosts"]["gpu2"]["lock"]
    assert (lock["run_id"], lock["keep"], lock["profile"]) == ("camp1", True, "tune campaign camp1")
    alone = plays[1]["orch"].extravars()["orch"]["hosts"]["gpu1"]["lock"]
    assert (alone["keep"], alone["profile"]) == (False, "cg_5tok") and alone["run_id"] != "camp1"


def _run(host: str, *events: tuple[str, str, dict]) -> HostRun:
    return HostRun(host, [TaskEvent(host, kind, "", action, result) for kind, action, result in events])


def test_a_failed_trial_is_rolled_back_under_the_campaigns_lock_which_it_keeps(
    inventory: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    before = load("cg_2step")
    good = launch.build(before)
    last_good = {
        "profile": before.name,
        "digest": good.digest,
        "unit": good.unit,
        "facts": playvars.unit_facts(before).model_dump(),
    }
    probe = result("sglang_probe", restart_needed=True, locked=True, digest=good.digest, last_good=last_good)
    failed = _run(
        "gpu2",
        ("ok", "sglang_probe", probe),
        ("ok", "sglang_stop", result("sglang_stop")),
        ("failed", "sglang_health_wait", {"reason": "exited", "msg": "exited"}),
    )
    seen: list[PlayVars] = []

    def run_playbook(name: str, inventory: Path, orch: PlayVars, **kw: Any) -> PlayResult:
        seen.append(orch)
        return PlayResult(2, "failed", {"gpu2": failed} if len(seen) == 1 else {}, tmp_path)

    monkeypatch.setattr(deploy, "run_playbook", run_playbook)
    monkeypatch.setattr(rollback, "run_playbook", run_playbook)
    campaign = deploy.Options(lock_id="camp1", keep_lock=True, lock_profile="tune campaign camp1")
    five = load("cg_5tok")
    report = deploy.deploy(five, inventory, campaign, each={"gpu2": load("cg_16tok")})
    [gpu2] = report.hosts
    assert not gpu2.ok and gpu2.rollback_error == "host not reached"  # the rollback play ran on it
    back = seen[1].hosts["gpu2"]
    assert back.digest == good.digest and back.profile == "cg_2step"
    assert (back.lock.run_id, back.lock.keep, back.lock.profile) == ("camp1", True, "tune campaign camp1")


def test_rollback_hosts_takes_the_runs_own_lock_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    prof = load("cg_5tok")
    good = launch.build(prof)
    record = {"profile": prof.name, "digest": good.digest, "unit": good.unit}
    record["facts"] = playvars.unit_facts(prof).model_dump()
    seen: list[PlayVars] = []

    def run_playbook(name: str, inventory: Path, orch: PlayVars, **kw: Any) -> PlayResult:
        seen.append(orch)
        return PlayResult(0, "successful", {}, tmp_path)

    monkeypatch.setattr(rollback, "run_playbook", run_playbook)

    def reports() -> list[HostReport]:
        return [HostReport(host="gpu1", ok=False, step="health", last_good=record)]

    inv = tmp_path / "hosts.yml"
    rollback.rollback_hosts(inv, reports(), "sglang.service", 1800, "run9", prefer_record=True)
    rollback.rollback_hosts(
        inv,
        reports(),
        "sglang.service",
        1800,
        "run9",
        prefer_record=True,
        lock_id="camp1",
        keep_lock=True,
        lock_profile="tune",
    )
    own, kept = seen[0].hosts["gpu1"].lock, seen[1].hosts["gpu1"].lock
    assert (own.run_id, own.keep, own.profile) == ("run9", False, "cg_5tok")
    assert (kept.run_id, kept.keep, kept.profile) == ("camp1", True, "tune")
