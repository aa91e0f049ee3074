"""The host's deploy lock (playbooks/module_utils/orchestrator_host/lock.py, taken by sglang_probe):
another deploy waits, a dead one's lock is taken over, a deploy stopped by Ctrl-C hands its
lock to its own rollback, which then lets it go, and the play keeps a kept lock (LockSpec.keep)."""

from __future__ import annotations

import json
import time
import types
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from orchestrator.paths import PLAYBOOKS_DIR, module_utils


@pytest.fixture
def host():
    lock, units = module_utils("orchestrator_host.lock"), module_utils("orchestrator_host.units")
    return types.SimpleNamespace(
        try_lock=lock.try_lock, release_if_ours=lock.release_if_ours, lock_path=units.lock_path
    )


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    return {"unit_dir": str(tmp_path), "state_dir": str(tmp_path), "lock_dir": str(tmp_path / "run")}


def holder(run_id: str, pid: int, live: list[int]) -> dict:
    return {"holder": f"me (pid {pid})", "run_id": run_id, "control": "vm", "pid": pid, "live_pids": live}


def take(host, paths: dict, run_id: str, pid: int = 10, live: tuple[int, ...] = (10, 20)) -> dict | None:
    mine = {**holder(run_id, pid, list(live)), "expires": time.time() + 600}
    record = {k: v for k, v in mine.items() if k != "live_pids"}
    return host.try_lock(host.lock_path(paths, "sglang.service"), mine, record)


def test_a_live_deploy_keeps_its_lock_and_a_dead_ones_is_taken_over(host, paths):
    assert take(host, paths, "a", pid=10) is None
    assert take(host, paths, "b", pid=20)["run_id"] == "a"  # PID 10 still runs: wait for it
    assert take(host, paths, "b", pid=20, live=(20,)) is None  # PID 10 is gone: its lock is stale


def test_after_ctrl_c_the_same_run_takes_its_lock_again_and_the_probe_releases_it(host, paths):
    path = Path(host.lock_path(paths, "sglang.service"))
    assert take(host, paths, "run1") is None
    assert take(host, paths, "run1") is None  # the rollback of the interrupted run, same PID still alive
    assert host.release_if_ours(paths, "sglang.service", "other") is False
    assert json.loads(path.read_text())["run_id"] == "run1"  # not ours: left alone
    assert host.release_if_ours(paths, "sglang.service", "run1") is True
    assert not path.exists()


def _release_paths() -> tuple[str, list[str]]:
    """The two places playbooks/deploy.yml lets a host's lock go, as written there: the run id
    the record releases (tasks/settle.yml) and the conditions of the `always:` release."""
    settle = yaml.safe_load((PLAYBOOKS_DIR / "tasks/settle.yml").read_text())
    [record] = [t for t in settle if "sglang_record" in str(t.get("ansible.builtin.import_role"))]
    [play] = yaml.safe_load((PLAYBOOKS_DIR / "deploy.yml").read_text())
    [block] = play["tasks"]
    [release] = [t for t in block["always"] if t["ansible.builtin.include_role"]["name"] == "sglang_probe"]
    return record["vars"]["sglang_record_release_run_id"], release["when"]


@pytest.mark.parametrize("keep", [False, True])
def test_the_play_releases_a_lock_at_its_end_unless_it_is_kept(keep: bool) -> None:
    """Evaluated by Ansible's own templating, as the play does: an ok host's record releases the
    run's lock, a failed host's `always:` does; neither touches a kept lock (a tune campaign's)."""
    record_releases, always_when = _release_paths()
    plan = {"lock": {"run_id": "camp1", "keep": keep}}
    held = Templar(DataLoader(), variables={"_plan": plan, "__sglang_probe": {"locked": True}})
    assert held.template(trust_as_template(record_releases)) == ("" if keep else "camp1")
    # A failed host: the record never ran (__sglang_record undefined).
    assert all(held.evaluate_conditional(trust_as_template(c)) for c in always_when) is not keep
    # Check mode: no lock in the plan, none taken; the conditions stop before reading it.
    dry = Templar(DataLoader(), variables={"_plan": {"lock": None}, "__sglang_probe": {"locked": False}})
    assert dry.template(trust_as_template(record_releases)) == ""
    assert not all(dry.evaluate_conditional(trust_as_template(c)) for c in always_when)
