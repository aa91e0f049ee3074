"""roles/sglang_probe: what is installed and running, the restart decision, the deploy lock and
the preflight checks under it, through the module's main()."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units import (
    lock_path,
    unit_digest,
)
from hostfakes import MANAGED, capture, load_module, systemctl_show

from orchestrator.paths import PLAYBOOKS_DIR

UNIT = f"{MANAGED}# profile: llama-8b\n[Unit]\nDescription=SGLang\n[Service]\nExecStart=/bin/true\n"
DIGEST = unit_digest(UNIT.encode())
ACTIVE = {"LoadState": "loaded", "ActiveState": "active", "MainPID": "4242", "NRestarts": "0"}
INACTIVE = {"LoadState": "not-found", "ActiveState": "inactive", "MainPID": "0"}


@pytest.fixture
def probe():
    return load_module("sglang_probe")


def install(paths: dict, facts: dict | None = None, digest: str = DIGEST) -> None:
    Path(paths["unit_dir"], "sglang.service").write_text(UNIT)
    if facts is not None:
        Path(paths["state_dir"], "units").mkdir(parents=True)
        Path(paths["state_dir"], "units", "sglang.service.json").write_text(
            json.dumps({**facts, "digest": digest})
        )


def probe_args(paths: dict) -> dict:
    """The probe's arguments other than its preflight checks: a deploy that wants the lock."""
    return {
        "unit_name": "sglang.service",
        "paths": paths,
        "desired_digest": "feedfeedfeedfeed",
        "lock": lock(),
    }


def lock(run_id: str = "r1", wait_s: float = 0.0) -> dict:
    return {
        "holder": "me@vm (pid 1)",
        "run_id": run_id,
        "ttl_s": 600,
        "wait_s": wait_s,
        "control": "vm",
        "pid": 1,
    }


def test_nothing_installed_is_reported_without_a_decision(probe, host, paths, run_module):
    host.answers["systemctl"] = [systemctl_show(**INACTIVE)]
    failed, result = run_module(probe, {"unit_name": "sglang.service", "paths": paths})
    assert not failed and result["changed"] is False
    assert (result["installed"], result["digest"], result["facts"], result["restart_needed"]) == (
        False,
        "",
        {},
        False,
    )
    assert (result["health_url"], result["health_status"], result["healthy"]) == ("", None, False)
    assert (result["locked"], result["preflight"], result["last_good"], result["uptime_s"]) == (
        False,
        {},
        {},
        None,
    )


def test_a_running_unit_is_asked_for_health_at_the_url_stored_with_it(probe, host, paths, run_module, server):
    install(paths, {"profile": "llama-8b", "port": 30000, "health_url": f"{server}/health"})
    host.answers["systemctl"] = [systemctl_show(**ACTIVE, ActiveEnterTimestampMonotonic="1000000")]
    failed, result = run_module(
        probe, {"unit_name": "sglang.service", "paths": paths, "desired_digest": DIGEST, "lock": lock()}
    )
    assert not failed
    assert result["installed"] and result["digest"] == DIGEST and result["profile"] == "llama-8b"
    assert result["facts"] == {"profile": "llama-8b", "port": 30000, "health_url": f"{server}/health"}
    assert (result["health_url"], result["health_status"], result["healthy"]) == (
        f"{server}/health",
        200,
        True,
    )
    assert result["restart_needed"] is False and result["locked"] is False
    assert result["uptime_s"] > 0
    assert not Path(lock_path(paths, "sglang.service")).exists()


def test_the_planned_health_url_wins_and_a_non_200_is_not_healthy(probe, host, paths, run_module, server):
    install(paths, {"health_url": f"{server}/health"})
    host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
    failed, result = run_module(
        probe, {"unit_name": "sglang.service", "paths": paths, "health_url": f"{server}/loading"}
    )
    assert not failed and (result["health_status"], result["healthy"]) == (503, False)


def test_facts_stored_with_another_unit_text_are_not_this_units(probe, host, paths, run_module, server):
    install(paths, {"health_url": f"{server}/health"}, digest="0000000000000000")
    host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
    failed, result = run_module(probe, {"unit_name": "sglang.service", "paths": paths})
    assert not failed and result["facts"] == {} and result["health_url"] == ""
    assert result["health_status"] is None


def test_a_needed_restart_takes_the_lock(probe, host, paths, run_module):
    install(paths)
    host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
    args = {
        "unit_name": "sglang.service",
        "paths": paths,
        "desired_digest": "feedfeedfeedfeed",
        "lock": lock(),
    }
    secret = {"secret_path": str(Path(paths["state_dir"]) / "sglang.config.yaml"), "secret_content": "k"}
    failed, result = run_module(probe, {**args, **secret, "force_restart": True})
    assert not failed and result["restart_needed"] and result["locked"]
    assert result["reasons"] == [
        f"unit differs ({DIGEST} -> feedfeedfeedfeed)",
        "secret config differs",
        "--force-restart",
    ]
    held = json.loads(Path(lock_path(paths, "sglang.service")).read_text())
    assert held["run_id"] == "r1" and "live_pids" not in held


def test_check_mode_takes_no_lock(probe, host, paths, run_module):
    host.answers["systemctl"] = [systemctl_show(**INACTIVE)]
    args = {"unit_name": "sglang.service", "paths": paths, "desired_digest": DIGEST, "lock": lock()}
    failed, result = run_module(probe, args, check_mode=True)
    assert not failed and result["restart_needed"] and not result["locked"]
    assert result["reasons"] == ["unit not installed", "service is inactive"]
    assert not Path(lock_path(paths, "sglang.service")).exists()


def test_another_deploys_lock_fails_the_probe_naming_it(probe, host, paths, run_module):
    Path(paths["lock_dir"]).mkdir()
    Path(lock_path(paths, "sglang.service")).write_text(
        json.dumps(
            {"holder": "ann@ws (pid 9)", "run_id": "x", "profile": "qwen", "expires": 2**40, "since": 0}
        )
    )
    host.answers["systemctl"] = [systemctl_show(**INACTIVE)]
    args = {"unit_name": "sglang.service", "paths": paths, "desired_digest": DIGEST, "lock": lock()}
    failed, result = run_module(probe, args)
    assert failed and result["msg"].startswith("another deploy holds this host: ann@ws (pid 9) since ")
    assert result["lock_holder"]["profile"] == "qwen"


def test_preflight_problems_fail_the_probe_and_release_the_lock(probe, host, paths, run_module, tmp_path):
    install(paths)
    host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
    host.smi = [(capture("released-query-gpu.csv"), "")]
    checks = {
        "python": str(tmp_path / "no-python"),
        "sglang_version": "0.5.9",
        "model_path": str(tmp_path / "no-model"),
        "gpus": [0],
        "port": 1,
        "log_dir": str(tmp_path),
        "min_free_mib": 0,
    }
    failed, result = run_module(probe, {**probe_args(paths), "preflight": checks})
    assert failed and result["locked"] is False
    assert result["msg"] == (
        f"preflight: python {tmp_path}/no-python does not exist or is not executable; "
        f"model path: {tmp_path}/no-model does not exist"
    )
    assert result["preflight"]["gpus"] == 1 and result["digest"] == DIGEST and result["restart_needed"]
    assert not Path(lock_path(paths, "sglang.service")).exists()


def test_a_unit_that_is_not_ours_fails_the_probe_before_anything_stops(
    probe, host, paths, run_module, tmp_path
):
    """#21: the deploy's own preflight (under the lock, before the stop) names ssh.service's file."""
    ssh = {"Id": "ssh.service", "LoadState": "loaded", "FragmentPath": "/lib/systemd/system/ssh.service"}
    host.answers["systemctl"] = [systemctl_show(**ssh, ActiveState="active", MainPID="612")]
    host.smi = [(capture("released-query-gpu.csv"), "")]
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    python = tmp_path / "python"
    python.write_text("")
    python.chmod(0o755)
    host.answers["python"] = lambda argv: (0, "0.5.9\n", "") if argv[1] == "-c" else (0, "--model-path\n", "")
    checks = {"python": str(python), "sglang_version": "0.5.9", "model_path": str(tmp_path / "model")}
    checks |= {"gpus": [0], "port": 1, "log_dir": str(tmp_path), "min_free_mib": 0}
    failed, result = run_module(probe, {**probe_args(paths), "unit_name": "ssh.service", "preflight": checks})
    assert failed and result["locked"] is False and result["restart_needed"]
    assert result["msg"].startswith(
        "preflight: ssh.service is not orchestrator's: systemd loads it from /lib/systemd/system/ssh.service"
    )
    assert not Path(lock_path(paths, "ssh.service")).exists()


def test_no_preflight_when_nothing_changes(probe, host, paths, run_module):
    install(paths)
    host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
    checks = {"python": "/nope", "sglang_version": "1", "model_path": "/nope", "gpus": [0], "port": 1}
    args = {"unit_name": "sglang.service", "paths": paths, "desired_digest": DIGEST, "preflight": checks}
    failed, result = run_module(probe, args)
    assert not failed and result["preflight"] == {}


def test_a_lock_without_its_required_keys_is_refused(probe, host, paths, run_module):
    host.answers["systemctl"] = [systemctl_show(**INACTIVE)]
    failed, result = run_module(
        probe, {"unit_name": "sglang.service", "paths": paths, "lock": {"holder": "me"}}
    )
    assert failed and result["msg"].startswith("lock: missing required arguments: ")
    assert "run_id" in result["msg"]


def test_systemctl_failing_fails_naming_the_unit(probe, host, paths, run_module):
    host.answers["systemctl"] = [(1, "", "Failed to connect to bus")]
    failed, result = run_module(probe, {"unit_name": "sglang.service", "paths": paths})
    assert failed and result["msg"] == "systemctl show sglang.service failed: Failed to connect to bus"


def test_the_secret_is_compared_on_the_host_and_never_returned(probe, host, paths, run_module):
    """The planned --config text goes to the host (no_log) and is compared there: no digest of the
    key leaves the control machine, and the result never carries the key."""
    install(paths)
    secret = Path(paths["state_dir"]) / "sglang.config.yaml"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text('api-key: "sk-same"\n')
    args = {
        "unit_name": "sglang.service",
        "paths": paths,
        "desired_digest": DIGEST,
        "secret_path": str(secret),
    }
    for content, differs in (('api-key: "sk-same"\n', False), ('api-key: "sk-other"\n', True)):
        host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
        failed, result = run_module(probe, {**args, "secret_content": content})
        assert not failed and ("secret config differs" in result["reasons"]) is differs
        assert "sk-" not in json.dumps({k: v for k, v in result.items() if k != "invocation"})


def test_an_adaptive_config_edited_or_lost_on_the_host_is_a_restart(probe, host, paths, run_module):
    """The unit shows the config's text, so a new one is a new digest; a file that no longer holds
    it is a restart too, whose unit step writes it back."""
    install(paths)
    tiers = Path(paths["state_dir"]) / "sglang.tiers.json"
    tiers.parent.mkdir(parents=True, exist_ok=True)
    config = '{\n  "1": {"candidate_steps": [1, 3]}\n}\n'
    args = {"unit_name": "sglang.service", "paths": paths, "desired_digest": DIGEST}
    args |= {"adaptive_path": str(tiers), "adaptive_content": config}
    for text, differs in ((config, False), (config.replace("3]", "5]"), True), (None, True)):
        if text is None:
            tiers.unlink()
        else:
            tiers.write_text(text)
        host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
        failed, result = run_module(probe, args)
        assert not failed and ("adaptive config differs" in result["reasons"]) is differs


def test_under_the_lock_a_container_profile_is_checked_in_its_image(probe, host, paths, run_module, tmp_path):
    """The same checks as sglang_preflight's, engine and image included: podman is not installed."""
    install(paths)
    host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
    host.smi = [(capture("released-query-gpu.csv"), "")]
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    checks = {
        "python": "python3",
        "sglang_version": "0.5.9",
        "model_path": str(tmp_path / "model"),
        "gpus": [0],
        "port": 1,
        "log_dir": str(tmp_path),
        "min_free_mib": 0,
        "engine": "podman",
        "image": "docker.io/lmsysorg/sglang:v0.5.9",
        "pull": "never",
    }
    failed, result = run_module(probe, {**probe_args(paths), "preflight": checks})
    assert failed and result["msg"] == (
        "preflight: podman is not installed on this host (runtime.kind: podman): install it "
        "(apt-get install podman) or set another runtime.kind"
    )
    assert result["preflight"]["notes"] == [] and not Path(lock_path(paths, "sglang.service")).exists()
    failed, result = run_module(probe, {**probe_args(paths), "preflight": {**checks, "engine": "lxc"}})
    assert failed and "engine" in result["msg"] and "lxc" in result["msg"]


# --- a kept lock (a tune campaign's, held between its trials) --------------------------------


def kept(run_id: str = "camp1", keep: bool = True) -> dict:
    return {**lock(run_id), "profile": "tune campaign camp1", "keep": keep}


def test_a_kept_lock_is_taken_where_nothing_changes_and_ended_by_the_runs_last_deploy(
    probe, host, paths, run_module
):
    """The campaign holds the host even for a trial that is already deployed; another deploy waits
    and is told who holds it; the campaign's last deploy (keep false) lets it go."""
    install(paths)
    held = Path(lock_path(paths, "sglang.service"))
    nothing_to_do = {"unit_name": "sglang.service", "paths": paths, "desired_digest": DIGEST}
    host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
    failed, result = run_module(probe, {**nothing_to_do, "lock": kept()})
    assert not failed and not result["restart_needed"] and result["locked"] is True
    assert json.loads(held.read_text())["keep"] is True
    other = {**lock("other"), "live_pids": [1]}  # the campaign's process still runs
    failed, result = run_module(probe, {**nothing_to_do, "lock": other})
    assert not failed and result["locked"] is False and held.exists()  # no restart: no wait either
    failed, result = run_module(probe, {**probe_args(paths), "lock": other})
    assert failed and result["lock_holder"]["profile"] == "tune campaign camp1"
    assert "deploying tune campaign camp1" in result["msg"]
    failed, result = run_module(probe, {**nothing_to_do, "lock": kept(keep=False)})
    assert not failed and result["locked"] is False and not held.exists()


def test_preflight_problems_leave_a_kept_lock_held(probe, host, paths, run_module, tmp_path):
    install(paths)
    host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
    host.smi = [(capture("released-query-gpu.csv"), "")]
    checks = {"python": str(tmp_path / "no-python"), "sglang_version": "0.5.9", "gpus": [0], "port": 1}
    checks |= {"model_path": str(tmp_path / "no-model"), "log_dir": str(tmp_path), "min_free_mib": 0}
    failed, result = run_module(probe, {**probe_args(paths), "lock": kept(), "preflight": checks})
    assert failed and result["msg"].startswith("preflight: ") and result["locked"] is True
    assert json.loads(Path(lock_path(paths, "sglang.service")).read_text())["run_id"] == "camp1"


# --- what the play does next: decided here, routed by the playbooks ---------------------------


def record(paths: dict, digest: str) -> None:
    Path(paths["state_dir"], "last-good").mkdir(parents=True, exist_ok=True)
    Path(paths["state_dir"], "last-good", "sglang.service.json").write_text(json.dumps({"digest": digest}))


def test_a_healthy_recorded_plan_ends_the_play(probe, host, paths, run_module, server):
    install(paths, {"health_url": f"{server}/health"})
    record(paths, DIGEST)
    host.answers["systemctl"] = [systemctl_show(**ACTIVE, InvocationID="abc")]
    args = {"unit_name": "sglang.service", "paths": paths, "desired_digest": DIGEST, "lock": lock()}
    failed, result = run_module(probe, args)
    assert not failed and result["end_play"] is True
    assert (result["wait_health"], result["record"], result["release_on_failure"]) == (False, False, False)
    assert result["journal"] is True


def test_a_healthy_plan_not_yet_recorded_is_recorded_without_a_restart(
    probe, host, paths, run_module, server
):
    install(paths, {"health_url": f"{server}/health"})
    record(paths, "0000000000000000")  # the last good deploy was another unit
    host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
    args = {"unit_name": "sglang.service", "paths": paths, "desired_digest": DIGEST, "lock": lock()}
    failed, result = run_module(probe, args)
    assert not failed and not result["restart_needed"]
    assert (result["end_play"], result["wait_health"], result["record"]) == (False, False, True)
    assert result["release_run_id"] == "" and result["journal"] is False


def test_a_restart_under_the_lock_waits_records_and_releases_it(probe, host, paths, run_module):
    install(paths)
    record(paths, DIGEST)
    host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
    failed, result = run_module(probe, probe_args(paths))
    assert not failed and result["restart_needed"] and result["locked"]
    assert (result["end_play"], result["wait_health"], result["record"]) == (False, True, True)
    assert (result["release_run_id"], result["release_on_failure"]) == ("r1", True)


def test_check_mode_records_nothing(probe, host, paths, run_module):
    host.answers["systemctl"] = [systemctl_show(**INACTIVE)]
    args = {"unit_name": "sglang.service", "paths": paths, "desired_digest": DIGEST, "lock": lock()}
    failed, result = run_module(probe, args, check_mode=True)
    assert not failed and result["wait_health"] and result["record"] is False


def test_a_kept_lock_is_released_by_no_path_of_the_play(probe, host, paths, run_module):
    install(paths)
    host.answers["systemctl"] = [systemctl_show(**ACTIVE)]
    failed, result = run_module(probe, {**probe_args(paths), "lock": kept()})
    assert not failed and result["locked"] and result["record"]
    assert (result["release_run_id"], result["release_on_failure"]) == ("", False)


def _release_paths() -> tuple[str, list[str]]:
    """The two places playbooks/deploy.yml lets a host's lock go, as written there: the run id
    the record releases (tasks/settle.yml) and the conditions of the `always:` release."""
    settle = yaml.safe_load((PLAYBOOKS_DIR / "tasks/settle.yml").read_text())
    [record] = [t for t in settle if "sglang_record" in str(t.get("ansible.builtin.import_role"))]
    [play] = yaml.safe_load((PLAYBOOKS_DIR / "deploy.yml").read_text())
    [block] = play["tasks"]
    [release] = [
        t
        for t in block["always"]
        if t["ansible.builtin.include_role"]["name"] == "orchestrator.sglang.sglang_probe"
    ]
    return record["vars"]["sglang_record_release_run_id"], release["when"]


@pytest.mark.parametrize("keep", [False, True])
def test_the_play_releases_a_lock_at_its_end_unless_it_is_kept(probe, keep: bool) -> None:
    """The probe decides, the play routes it, evaluated by Ansible's own templating as the play
    does: an ok host's record releases the run's lock, a failed host's `always:` does; neither
    touches a kept lock (a tune campaign's)."""
    record_releases, always_when = _release_paths()
    lock = {"run_id": "camp1", "keep": keep}
    said = {"restart_needed": True, "healthy": False, "last_good": {}, "locked": True, "state": {}}
    result = {**said, **probe.decide(said, "feedfeedfeedfeed", False, lock)}
    held = Templar(DataLoader(), variables={"_plan": {"lock": lock}, "__sglang_probe": result})
    assert held.template(trust_as_template(record_releases)) == ("" if keep else "camp1")
    # A failed host: the record never ran (__sglang_record undefined).
    assert all(held.evaluate_conditional(trust_as_template(c)) for c in always_when) is not keep
    # Check mode: no lock in the plan, none taken.
    said = {**said, "locked": False}
    result = {**said, **probe.decide(said, "feedfeedfeedfeed", True, {})}
    dry = Templar(DataLoader(), variables={"_plan": {"lock": None}, "__sglang_probe": result})
    assert dry.template(trust_as_template(record_releases)) == ""
    assert not all(dry.evaluate_conditional(trust_as_template(c)) for c in always_when)
    # A probe that failed before it decided (another deploy held the lock): nothing to release.
    failed = Templar(DataLoader(), variables={"_plan": {"lock": lock}, "__sglang_probe": {"failed": True}})
    assert not all(failed.evaluate_conditional(trust_as_template(c)) for c in always_when)


def test_the_read_ahead_reads_a_model_that_fits_and_never_one_that_does_not(tmp_path: Path) -> None:
    """Before the stop, the new model's files go into the page cache, but only where all of them
    fit beside what the host keeps free: a part would be evicted again while the server loads."""
    probe = load_module("sglang_probe")
    model = tmp_path / "model"
    model.mkdir()
    header = b'{"w": {"dtype": "U8", "shape": [8388608], "data_offsets": [0, 8388608]}}'
    (model / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\1" * 8388608)
    spec = {"dirs": [str(model)], "timeout_s": 30.0}
    too_big = probe.read_ahead({**spec, "reserve_mib": 2**40})  # more than any host has
    assert too_big["stopped"] == "memory" and too_big["read_bytes"] == 0
    done = probe.read_ahead({**spec, "reserve_mib": 0})
    if done["stopped"] == "unknown":
        pytest.skip("this kernel does not tell which pages are cached")
    assert done["stopped"] == "" and done["resident_after"] == done["total_bytes"] > 8388608
