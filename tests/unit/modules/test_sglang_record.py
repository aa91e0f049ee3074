"""roles/sglang_record: the last-good record with its facts, written once, and the lock released."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostfakes import load_module

FACTS = {
    "profile": "llama-8b",
    "port": 30000,
    "bind": "0.0.0.0",
    "gpus": [0],
    "health_url": "http://x/health",
}


@pytest.fixture
def record():
    return load_module("sglang_record")


@pytest.fixture
def args(paths: dict) -> dict:
    return {
        "unit_name": "sglang.service",
        "paths": paths,
        "profile": "llama-8b",
        "digest": "0123456789abcdef",
        "unit": "[Unit]\n",
        "facts": FACTS,
    }


def written(paths: dict) -> Path:
    return Path(paths["state_dir"], "last-good", "sglang.service.json")


def test_records_once_and_keeps_its_time(record, args, paths, run_module):
    failed, result = run_module(record, args)
    assert not failed and (result["changed"], result["recorded"], result["released"]) == (True, True, False)
    rec = json.loads(written(paths).read_text())
    assert {k: rec[k] for k in ("profile", "digest", "unit", "facts")} == {
        "profile": "llama-8b",
        "digest": "0123456789abcdef",
        "unit": "[Unit]\n",
        "facts": FACTS,
    }
    assert rec["time"].endswith("Z") and len(rec["time"]) == 20
    assert written(paths).stat().st_mode & 0o777 == 0o600
    assert written(paths).parent.stat().st_mode & 0o777 == 0o700
    failed, again = run_module(record, args)
    assert (again["changed"], again["recorded"]) == (False, False)
    assert json.loads(written(paths).read_text())["time"] == rec["time"]


def test_new_facts_for_the_same_digest_are_recorded(record, args, paths, run_module):
    run_module(record, args)
    failed, result = run_module(record, {**args, "facts": {**FACTS, "port": 30001}})
    assert (
        not failed and result["recorded"] and json.loads(written(paths).read_text())["facts"]["port"] == 30001
    )


def test_releases_only_the_runs_own_lock(record, args, paths, run_module):
    lock = Path(paths["lock_dir"], "sglang.service.lock")
    lock.parent.mkdir()
    lock.write_text(json.dumps({"run_id": "other"}))
    failed, result = run_module(record, {**args, "release_run_id": "r1"})
    assert result["released"] is False and lock.exists()
    lock.write_text(json.dumps({"run_id": "r1"}))
    failed, result = run_module(record, {**args, "release_run_id": "r1"})
    assert (failed, result["changed"], result["recorded"], result["released"]) == (False, True, False, True)
    assert not lock.exists()


def test_check_mode_writes_nothing(record, args, paths, run_module):
    failed, result = run_module(record, args, check_mode=True)
    assert not failed and result["changed"] and result["recorded"]
    assert not Path(paths["state_dir"]).exists()
