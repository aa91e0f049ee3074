"""Stopping a unit: systemctl stop, then the wait until its cgroup is empty and its GPUs are
released (sglang_stop, and the restart transaction sglang_restart).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .containers import unit_containers
from .files import read_json
from .gpus import idle_message, wait_idle
from .options import PATHS_SPEC
from .procs import cgroup_procs
from .systemd import systemctl_show
from .units import OWNER_PROPS, facts_path, foreign_unit

if TYPE_CHECKING:  # never run: the same submodules, named as Mitogen's module finder needs them
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.containers
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.files
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.gpus
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.procs
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.systemd
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units  # noqa: F401

ARGUMENT_SPEC = {
    "unit_name": {"type": "str", "required": True, "description": "The systemd unit to stop."},
    "paths": {
        **PATHS_SPEC,
        "description": (
            "Where orchestrator keeps things on the host. The unit's stored facts give its GPUs when "
            "I(gpus) is empty; the other units' facts name their processes, never killed."
        ),
    },
    "gone_timeout_s": {
        "type": "float",
        "default": 30.0,
        "description": "Seconds to wait for the unit's cgroup to empty after the stop.",
    },
    "gpus": {
        "type": "list",
        "elements": "int",
        "default": [],
        "description": (
            "GPU indices to wait for; empty means the GPUs in the unit's stored facts, and every GPU "
            "on the host only for a unit stored without them."
        ),
    },
    "gpu_release_timeout_s": {
        "type": "float",
        "default": 30.0,
        "description": "Seconds to wait for the GPUs' memory to be released.",
    },
    "kill_gpu_holders": {
        "type": "bool",
        "default": False,
        "description": (
            "Kill the processes nvidia-smi still lists on the GPUs after the stop (as gpu_idle does), "
            "except those of another orchestrator unit of this host."
        ),
    },
    "max_used_mib": {
        "type": "int",
        "default": 0,
        "description": "A GPU counts as released at or below this many MiB used.",
    },
    "nvidia_smi": {"type": "str", "default": "nvidia-smi", "description": "The nvidia-smi executable."},
    "disable": {
        "type": "bool",
        "default": False,
        "description": (
            "Also disable the unit, so that a reboot does not start it again and its port counts as "
            "free for another unit (C(orchestrator stop)); a restart within a deploy leaves it "
            "enabled."
        ),
    },
}
PROPS = (*OWNER_PROPS, "ActiveState", "MainPID", "ControlGroup", "UnitFileState")
RUNNING = ("active", "activating", "deactivating", "reloading")


def stop(module: Any, unit: str, gone_timeout_s: float, result: dict) -> float:
    """systemctl stop, then wait until no process of the unit's cgroup is left; seconds taken."""
    start = time.monotonic()
    rc, _out, err = module.run_command([module.get_bin_path("systemctl", required=True), "stop", unit])
    if rc != 0:
        module.fail_json(msg=f"systemctl stop {unit} failed: {err.strip()}", **result)
    deadline = time.monotonic() + gone_timeout_s
    while True:
        now = systemctl_show(module, unit, PROPS)
        left = cgroup_procs(now.get("ControlGroup", ""))
        stopped = now.get("MainPID") == "0" and now.get("ActiveState") in ("inactive", "failed")
        # Its container may run outside the cgroup (docker's, under the daemon): gone too?
        running = unit_containers(module, unit) if stopped and not left else []
        if stopped and not left and not running:
            return round(time.monotonic() - start, 2)
        if time.monotonic() > deadline:
            if running:
                module.fail_json(msg=f"{unit} is stopped but its container (PID {running}) runs on", **result)
            left = left or [now.get("MainPID", "")]
            module.fail_json(msg=f"{unit} still has processes {left} after stop", **result)
        time.sleep(0.1)


def unit_gpus(paths: dict, unit: str, gpus: list[int]) -> list[int]:
    """The GPUs to wait for: those given, else the unit's own (its stored facts); [] (every GPU)
    only for a unit stored without facts. Another server of this host keeps its GPUs busy."""
    stored = read_json(facts_path(paths, unit)).get("gpus")
    return gpus or (stored if isinstance(stored, list) else [])


def run(module: Any, p: dict) -> dict:
    """sglang_stop's work on the host: its result, or fail_json (which ends the module)."""
    before = systemctl_show(module, p["unit_name"], PROPS)
    foreign = foreign_unit(before, p["paths"], p["unit_name"])
    if foreign:
        module.fail_json(msg=f"{foreign}: orchestrator stops only the units it deployed", changed=False)
    was_active = before.get("ActiveState") in RUNNING
    result: dict[str, Any] = {
        "changed": was_active,
        "was_active": was_active,
        "main_pid": int(before.get("MainPID") or 0),
    }
    result["stop_s"] = 0.0
    if before.get("LoadState") != "not-found" and not module.check_mode:
        result["stop_s"] = stop(module, p["unit_name"], p["gone_timeout_s"], result)
    result["disabled"] = p["disable"] and before.get("UnitFileState") == "enabled"
    if result["disabled"] and not module.check_mode:
        argv = [module.get_bin_path("systemctl", required=True), "disable", p["unit_name"]]
        rc, _out, err = module.run_command(argv)
        if rc != 0:
            module.fail_json(msg=f"systemctl disable {p['unit_name']} failed: {err.strip()}", **result)
    release_timeout_s = 0.0 if module.check_mode else p["gpu_release_timeout_s"]
    result["gpus"] = wait_idle(
        module,
        paths=p["paths"],
        nvidia_smi=p["nvidia_smi"],
        gpus=unit_gpus(p["paths"], p["unit_name"], p["gpus"]),
        max_used_mib=p["max_used_mib"],
        release_timeout_s=release_timeout_s,
        poll_interval_s=0.5,
        kill_holders=p["kill_gpu_holders"],
        allow_unit="",
        check_mode=module.check_mode,
    )
    result["changed"] = was_active or result["disabled"] or bool(result["gpus"]["killed"])
    if not result["gpus"]["idle"] and not module.check_mode:
        module.fail_json(msg=idle_message(result["gpus"], release_timeout_s), **result)
    return result
