"""The host's deploy lock (plugins/module_utils/orchestrator_host/lock.py, taken by sglang_probe):
another deploy waits, a dead one's lock is taken over, a deploy stopped by Ctrl-C hands its
lock to its own rollback, which then lets it go (the play's release:
modules/test_sglang_probe.py)."""

from __future__ import annotations

import json
import time
import types
from pathlib import Path

import pytest

from orchestrator.paths import module_utils


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
