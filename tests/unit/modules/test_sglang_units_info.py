"""roles/sglang_units: which units status reports on a host."""

from __future__ import annotations

import pytest
from hostfakes import load_module, store_unit


@pytest.fixture
def units_info():
    return load_module("sglang_units_info")


def test_every_installed_orchestrator_unit_is_listed(units_info, paths, run_module):
    failed, result = run_module(units_info, {"paths": paths})
    assert not failed and (result["changed"], result["units"]) == (False, [])  # nothing deployed yet
    store_unit(paths, "sglang-b.service", profile="cg_2step", port=30001, gpus=[4, 5, 6, 7])
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=30000, gpus=[0, 1, 2, 3])
    store_unit(paths, "sglang-old.service", installed=False, profile="old", port=30002, gpus=[0])
    failed, result = run_module(units_info, {"paths": paths}, check_mode=True)
    assert not failed and result["units"] == ["sglang-a.service", "sglang-b.service"]


def test_a_named_unit_is_listed_alone_installed_or_not(units_info, paths, run_module):
    store_unit(paths, "sglang-a.service", profile="cg_5tok", port=30000, gpus=[0, 1, 2, 3])
    failed, result = run_module(units_info, {"paths": paths, "unit_name": "sglang.service"})
    assert not failed and result["units"] == ["sglang.service"]
