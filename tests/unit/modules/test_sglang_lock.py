"""roles/sglang_probe tasks/release.yml: the sglang_lock module releases only this run's lock,
and says so with changed (it said changed=False after deleting the lock)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostfakes import load_module


@pytest.fixture
def sglang_lock():
    return load_module("sglang_lock")


def held(paths: dict, run_id: str) -> Path:
    path = Path(paths["lock_dir"]) / "sglang.service.lock"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"run_id": run_id, "holder": "me"}))
    return path


def test_releasing_the_runs_lock_is_a_change(sglang_lock, paths, run_module):
    lock = held(paths, "r1")
    failed, result = run_module(sglang_lock, {"unit_name": "sglang.service", "paths": paths, "run_id": "r1"})
    assert not failed and result["changed"] is True and result["released"] is True
    assert not lock.exists()


def test_another_runs_lock_stays(sglang_lock, paths, run_module):
    lock = held(paths, "other")
    failed, result = run_module(sglang_lock, {"unit_name": "sglang.service", "paths": paths, "run_id": "r1"})
    assert not failed and result["changed"] is False and result["released"] is False
    assert result["holder"]["run_id"] == "other" and lock.exists()


def test_no_lock_is_no_change(sglang_lock, paths, run_module):
    failed, result = run_module(sglang_lock, {"unit_name": "sglang.service", "paths": paths, "run_id": "r1"})
    assert (failed, result["changed"], result["released"]) == (False, False, False)


def test_check_mode_reports_the_release_and_keeps_the_file(sglang_lock, paths, run_module):
    lock = held(paths, "r1")
    failed, result = run_module(
        sglang_lock, {"unit_name": "sglang.service", "paths": paths, "run_id": "r1"}, check_mode=True
    )
    assert not failed and result["changed"] is True and lock.exists()
