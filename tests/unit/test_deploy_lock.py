"""The host's deploy lock (sglang_probe's module): another deploy waits, a dead one's lock is taken
over, and a deploy stopped by Ctrl-C hands its lock to its own rollback, which then lets it go."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from orchestrator.paths import ROOT

LIBRARY = ROOT / "roles/sglang_probe/library/sglang_unit_facts.py"


@pytest.fixture
def facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("sglang_unit_facts", LIBRARY)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "LOCK_DIR", str(tmp_path))
    return module


def holder(run_id: str, pid: int, live: list[int]) -> dict:
    return {"holder": f"me (pid {pid})", "run_id": run_id, "control": "vm", "pid": pid, "live_pids": live}


def take(facts, run_id: str, pid: int = 10, live: tuple[int, ...] = (10, 20)) -> dict | None:
    mine = {**holder(run_id, pid, list(live)), "expires": time.time() + 600}
    return facts.try_lock(
        facts.lock_path("sglang.service"), mine, {k: v for k, v in mine.items() if k != "live_pids"}
    )


def test_a_live_deploy_keeps_its_lock_and_a_dead_ones_is_taken_over(facts):
    assert take(facts, "a", pid=10) is None
    assert take(facts, "b", pid=20)["run_id"] == "a"  # PID 10 still runs: wait for it
    assert take(facts, "b", pid=20, live=(20,)) is None  # PID 10 is gone: its lock is stale


def test_after_ctrl_c_the_same_run_takes_its_lock_again_and_the_probe_releases_it(facts):
    path = Path(facts.lock_path("sglang.service"))
    assert take(facts, "run1") is None
    assert take(facts, "run1") is None  # the rollback of the interrupted run, same PID still alive
    facts.release_if_ours("sglang.service", "other")
    assert json.loads(path.read_text())["run_id"] == "run1"  # not ours: left alone
    facts.release_if_ours("sglang.service", "run1")
    assert not path.exists()
