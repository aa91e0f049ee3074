"""roles/sglang_unit: secret, unit (verified by the real systemd-analyze) and facts in one step."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.files import write_atomic
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.lock import try_lock
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units import (
    facts_path,
    lock_path,
    record_path,
    unit_digest,
)
from hostfakes import MANAGED, NOT_FOUND, load_module, systemctl_show

from orchestrator.profile import model as profile_mod
from orchestrator.render import launch

pytestmark = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")

UNIT = f"{MANAGED}# profile: llama-8b\n[Unit]\nDescription=SGLang\n[Service]\nExecStart=/bin/true\n"
FACTS = {
    "profile": "llama-8b",
    "port": 30000,
    "bind": "0.0.0.0",
    "gpus": [0],
    "health_url": "http://x/health",
}


@pytest.fixture
def sglang_unit():
    return load_module("sglang_unit")


@pytest.fixture(autouse=True)
def systemd(host):
    """The real systemd-analyze; systemctl (no systemd runs here) answers as systemd does for a unit
    it knows nowhere, unless a test answers otherwise."""

    def analyze(argv: list[str]) -> tuple[int, str, str]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        return done.returncode, done.stdout, done.stderr

    host.answers["systemd-analyze"] = analyze
    host.answers["systemctl"] = [NOT_FOUND]
    return host


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


def test_the_adaptive_config_is_written_beside_the_secret(sglang_unit, args, paths, run_module):
    """The --speculative-adaptive-config JSON: root's 0600 file, which systemd hands to the server as
    a credential; written again only when it differs."""
    tiers = Path(paths["state_dir"], "sglang.tiers.json")
    config = '{\n  "1": {"candidate_steps": [1, 3]}\n}\n'
    args = {**args, "adaptive_path": str(tiers), "adaptive_content": config}
    failed, result = run_module(sglang_unit, args)
    assert not failed and result["changed"]
    assert tiers.read_text() == config and mode(tiers) == 0o600
    failed, again = run_module(sglang_unit, args)
    assert not failed and again["changed"] is False
    failed, changed = run_module(sglang_unit, {**args, "adaptive_content": config.replace("3]", "5]")})
    assert not failed and changed["changed"] and "5]" in tiers.read_text()


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


def test_a_rollback_reinstalls_the_unit_that_ran_though_verify_now_refuses_a_line(
    sglang_unit, args, paths, run_module
):
    """A last-good unit recorded before the stricter verify (here `Nice=50`, which systemd ignored):
    the rollback's plan vouches for its digest (HostPlan.trusted_digest), so the host gets back what
    ran instead of staying without a server."""
    from orchestrator.hosts import playvars

    ran = UNIT + "Nice=50\n"
    record = {"profile": "llama-8b", "unit": ran, "digest": unit_digest(ran.encode()), "facts": FACTS}
    trusted = playvars.for_record("sglang.service", record).trusted_digest
    assert trusted == unit_digest(ran.encode())
    failed, result = run_module(sglang_unit, {**args, "content": ran})
    assert failed and "Nice priority out of range" in result["msg"]  # a deploy of it is refused
    failed, result = run_module(sglang_unit, {**args, "content": ran, "verified_digest": trusted})
    assert not failed and result["changed"], result.get("msg")
    assert Path(paths["unit_dir"], "sglang.service").read_text() == ran


def test_a_line_systemd_ignores_changes_no_file(sglang_unit, args, paths, run_module):
    """systemd-analyze verify exits 0 on it, and the unit would start without the setting."""
    run_module(sglang_unit, args)
    bad = UNIT + "Nice=50\nLimitNOFILE=1G\n"
    failed, result = run_module(sglang_unit, {**args, "content": bad, "secret_content": "api-key: new\n"})
    assert failed
    nice = bad.splitlines().index("Nice=50") + 1
    assert result["msg"] == (
        f"systemd-analyze verify refused sglang.service: sglang.service:{nice}: Nice priority out of range, "
        f"ignoring: 50; sglang.service:{nice + 1}: Failed to parse resource value, ignoring: 1G"
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


@pytest.mark.parametrize(
    ("shown", "message"),
    [
        (
            {"Id": "ssh.service", "LoadState": "loaded", "FragmentPath": "/lib/systemd/system/ssh.service"},
            "ssh.service is not orchestrator's: systemd loads it from /lib/systemd/system/ssh.service",
        ),
        (
            {"Id": "ssh.service", "LoadState": "masked", "FragmentPath": ""},
            "ssh.service is masked on this host",
        ),
    ],
)
def test_a_unit_that_is_not_ours_is_not_written(sglang_unit, args, paths, run_module, host, shown, message):
    """#21: a profile with `unit_name: ssh.service` wrote /etc/systemd/system/ssh.service, which
    overrides the package's unit (or unmasks a masked one)."""
    host.answers["systemctl"] = [systemctl_show(**shown)]
    for check_mode in (True, False):
        failed, result = run_module(sglang_unit, {**args, "unit_name": "ssh.service"}, check_mode=check_mode)
        assert failed and result["msg"].startswith(message), result["msg"]
        assert result["msg"].endswith("not writing over it; give this profile another service.unit_name")
    assert list(Path(paths["unit_dir"]).iterdir()) == [] and not Path(paths["state_dir"]).exists()
    assert not Path(args["secret_path"]).exists()


def test_a_file_of_someone_elses_in_the_unit_dir_is_left_as_it_is(sglang_unit, args, paths, run_module, host):
    mine = Path(paths["unit_dir"], "sglang.service")
    mine.write_text("[Service]\nExecStart=/opt/other\n")
    host.answers["systemctl"] = [
        systemctl_show(Id="sglang.service", LoadState="loaded", FragmentPath=str(mine))
    ]
    failed, result = run_module(sglang_unit, args)
    assert failed and "has no '# Managed by orchestrator:' line and no facts" in result["msg"]
    assert mine.read_text() == "[Service]\nExecStart=/opt/other\n"
    mine.write_text(UNIT + "# edited by hand\n")  # ours, edited: overwritten, as its header says
    failed, result = run_module(sglang_unit, args)
    assert not failed and mine.read_text() == UNIT


def test_every_file_named_after_the_longest_unit_name_fits(
    sglang_unit, paths, run_module, tmp_path, monkeypatch
):
    """#21: model.UNIT_NAME_LIMIT is what a host's file names hold (NAME_MAX): the unit and its
    verified temporary copy, the secret files plan names after its stem, its facts and their
    temporary copy, the last-good record, the lock. One character more and the facts cannot be written."""
    monkeypatch.setenv("K", "key")
    name = "a" * (profile_mod.UNIT_NAME_LIMIT - len(".service")) + ".service"
    path = tmp_path / "p.yml"
    doc = {"extends": "cg_5tok", "service": {"unit_name": name}, "api_key": {"env": "K"}}
    doc |= {"server": {"sglang_version": "0.5.23"}}
    doc |= {"speculative": {"eagle_topk": None, "num_draft_tokens": None, "adaptive": {"tiers": {1: [1, 3]}}}}
    path.write_text(yaml.safe_dump({**doc, "secret_env": {"HF_TOKEN": {"env": "K"}}}))
    p = launch.build(profile_mod.load(str(path)))
    secret = Path(paths["state_dir"], Path(p.secret_path).name)
    env = Path(paths["state_dir"], Path(p.env_file_path).name)
    tiers = Path(paths["state_dir"], Path(p.adaptive_path).name)
    args = {"unit_name": name, "paths": paths, "content": p.unit, "facts": FACTS, "secret_path": str(secret)}
    args |= {"adaptive_path": str(tiers), "adaptive_content": p.adaptive_config}
    failed, result = run_module(
        sglang_unit, {**args, "secret_content": "k", "env_path": str(env), "env_content": "e"}
    )
    assert not failed, result["msg"]
    assert Path(paths["unit_dir"], name).is_file() and secret.is_file() and env.is_file() and tiers.is_file()
    assert Path(facts_path(paths, name)).is_file()
    os.makedirs(os.path.dirname(record_path(paths, name)))
    write_atomic(record_path(paths, name), b"{}", 0o600)
    assert try_lock(lock_path(paths, name), {"run_id": "r1"}) is None
    longer = "a" + name
    with pytest.raises(OSError) as info:
        write_atomic(facts_path(paths, longer), b"{}", 0o600)
    assert info.value.errno == errno.ENAMETOOLONG
