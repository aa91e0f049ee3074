#!/usr/bin/python
"""Ansible module: stop a unit and return only once no process of its cgroup is left."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_service_stop
short_description: Stop a systemd unit and wait until its cgroup is empty
description:
  - systemctl stop sends SIGTERM to the unit's processes, waits TimeoutStopSec, then
    SIGKILLs what is left of the unit's own cgroup; nothing outside the unit is touched.
  - A unit that does not exist is already stopped.
  - One module instead of stop, show and wait tasks: every task costs a round trip.
options:
  unit: {description: The systemd unit., type: str, required: true}
  gone_timeout_s: {description: Seconds to wait for the cgroup to empty after stop., type: float, default: 30}
"""

RETURN = r"""
was_active: {description: whether the unit was running before, type: bool}
main_pid: {description: MainPID before the stop, type: int}
stop_s: {description: seconds the stop took, type: float}
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule


def show(module: AnsibleModule, unit: str) -> dict[str, str]:
    props = "LoadState,ActiveState,MainPID,ControlGroup"
    rc, out, err = module.run_command(["systemctl", "show", unit, f"--property={props}"])
    if rc != 0:
        module.fail_json(msg=f"systemctl show {unit} failed: {err.strip()}")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def cgroup_pids(control_group: str) -> list[str]:
    if not control_group:
        return []
    try:
        with open(f"/sys/fs/cgroup{control_group}/cgroup.procs") as fh:
            return fh.read().split()
    except OSError:
        return []


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "gone_timeout_s": {"type": "float", "default": 30},
        },
        supports_check_mode=True,
    )
    unit = module.params["unit"]
    before = show(module, unit)
    was_active = before.get("ActiveState") in ("active", "activating", "deactivating", "reloading")
    result = {"was_active": was_active, "main_pid": int(before.get("MainPID") or 0), "stop_s": 0.0}
    if before.get("LoadState") == "not-found" or module.check_mode:
        module.exit_json(changed=was_active, **result)
    start = time.monotonic()
    rc, _, err = module.run_command(["systemctl", "stop", unit])
    if rc != 0:
        module.fail_json(msg=f"systemctl stop {unit} failed: {err.strip()}", **result)
    deadline = time.monotonic() + module.params["gone_timeout_s"]
    while True:
        now = show(module, unit)
        left = cgroup_pids(now.get("ControlGroup", ""))
        if now.get("MainPID") == "0" and now.get("ActiveState") in ("inactive", "failed") and not left:
            break
        if time.monotonic() > deadline:
            left = left or [now.get("MainPID")]
            module.fail_json(msg=f"{unit} still has processes {left} after stop", **result)
        time.sleep(0.1)
    result["stop_s"] = round(time.monotonic() - start, 2)
    module.exit_json(changed=was_active, **result)


if __name__ == "__main__":
    os.environ.setdefault("SYSTEMD_PAGER", "")
    main()
