"""Whole module results, as the host modules return them, for tests that play a host's events.

orchestrator/hosts/module_results.py refuses a result that lacks a field its module always returns, so a test
gives `result(action, field=value, ...)`: the fields it cares about over the module's quiet
defaults (a unit not installed, idle GPUs, a healthy wait). test_results.py checks that each of
these validates, so they stay what the modules return.
"""

from __future__ import annotations

import copy
from typing import Any

_GPUS = {"idle": True, "checked": [], "gpus": [], "holders": [], "busy": [], "waited_s": 0.0, "killed": []}

DEFAULTS: dict[str, dict[str, Any]] = {
    "sglang_probe": {
        "installed": False,
        "digest": "",
        "profile": "",
        "unit": "",
        "facts": {},
        "health_url": "",
        "health_status": None,
        "healthy": False,
        "state": {},
        "uptime_s": None,
        "restart_needed": False,
        "reasons": [],
        "last_good": {},
        "locked": False,
        "preflight": {},
        "end_play": False,
        "wait_health": True,
        "record": True,
        "release_run_id": "",
        "release_on_failure": False,
        "journal": False,
    },
    "sglang_units_info": {"units": [], "foreign": []},
    "sglang_preflight": {
        "problems": [],
        "notes": [],
        "sglang_version": "",
        "gpus": 0,
        "help_checked": False,
        "verified_digest": "",
        "memory": {},
        "model_files": {},
    },
    "sglang_stop": {"was_active": False, "main_pid": 0, "stop_s": 0.0, "disabled": False, "gpus": _GPUS},
    "gpu_idle": _GPUS,
    "sglang_unit": {"digest": "", "unit_path": ""},
    "sglang_start": {"reloaded": False, "enabled": False, "started": False, "invocation_id": ""},
    "sglang_health_wait": {
        "elapsed_s": 0.0,
        "status": 200,
        "unit_state": {},
        "reason": "healthy",
        "done": True,
        "phase": "ready",
        "progress": None,
        "phase_s": 0.0,
        "quiet_s": 0.0,
        "phases": [],
        "eta_s": None,
        "lines": 0,
        "memory_lines": [],
    },
    "sglang_record": {"recorded": False, "released": False},
    "sglang_restart": {
        "steps": [],
        "failed_step": "",
        "done": False,
        "recorded": False,
        "released": False,
        "invocation_id": "",
    },
    "sglang_gateway": {
        "state": "absent",
        "before": {"listed": False},
        "after": {"listed": False},
        "drain": False,
    },
    "sglang_drain": {"mode": "drain", "in_flight": 0, "waited_s": 0.0, "timed_out": False, "status": None},
    "sglang_lock": {"released": False},
    "sglang_adopt": {
        "action": "find",
        "servers": [],
        "sglang_version": "",
        "systemd_path": "",
        "units": [],
        "problems": [],
    },
}


def result(action: str, **fields: Any) -> dict[str, Any]:
    """A successful result of module `action`: `fields` over its defaults, with Ansible's own keys."""
    return {"changed": False, **copy.deepcopy(DEFAULTS[action]), **fields, "_ansible_no_log": False}


def gpu(index: int, used_mib: int | None = 0, total_mib: int | None = 143771) -> dict[str, Any]:
    """One GPU of gpu_idle's `gpus`, as nvidia-smi reports an H200."""
    uuid = f"GPU-{index:08x}-0000-0000-0000-000000000000"
    return {
        "index": index,
        "uuid": uuid,
        "name": "NVIDIA H200",
        "memory_used_mib": used_mib,
        "memory_total_mib": total_mib,
    }
