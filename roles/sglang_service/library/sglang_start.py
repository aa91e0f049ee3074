#!/usr/bin/python
"""Ansible module: let systemd read the unit if it changed, enable it, start it.

ansible.builtin.systemd_service does the same in general form, and took 0.7-1.0 s of a 4.5 s
restart on the lab (its own module load and a reload it cannot know to skip); this is the one
transaction a restart needs, with the systemctl calls it needs and no others.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_start
short_description: Reload systemd when the unit changed, enable and start the SGLang unit
description:
  - Runs C(systemctl daemon-reload) only when systemd reports C(NeedDaemonReload=yes) for the unit
    (its file changed since systemd read it) or does not know the unit yet.
  - Enables the unit when it is not enabled, and starts it when it is not active.
  - Fails naming the unit and systemctl's message; whether the server then stays up is for the
    health wait (sglang_health_wait) to see.
attributes:
  check_mode:
    support: full
    details: In check mode nothing is reloaded, enabled or started; the result says what would be.
  diff_mode: {support: none}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
options:
  unit_name: {description: The systemd unit to start., type: str, required: true}
"""

EXAMPLES = r"""
- name: Start the server
  sglang_start:
    unit_name: sglang.service
  register: __sglang_service
"""

RETURN = r"""
reloaded:
  description: Whether systemd re-read its units (the unit file had changed).
  type: bool
  returned: always
enabled:
  description: Whether the unit had to be enabled.
  type: bool
  returned: always
started:
  description: Whether the unit had to be started.
  type: bool
  returned: always
invocation_id:
  description: The unit's InvocationID once started (a later one means systemd restarted it); empty in
    check mode.
  type: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.orchestrator_host.systemd import systemctl_show

ARGUMENT_SPEC = {
    "unit_name": {"type": "str", "required": True, "description": "The systemd unit to start."},
}
PROPS = ("LoadState", "NeedDaemonReload", "UnitFileState", "ActiveState")


def plan(state: dict[str, str]) -> dict[str, bool]:
    """What the unit needs, from `systemctl show`: a reload, enabling, a start."""
    return {
        "reloaded": state.get("NeedDaemonReload") == "yes" or state.get("LoadState") == "not-found",
        "enabled": state.get("UnitFileState") not in ("enabled", "enabled-runtime", "static"),
        "started": state.get("ActiveState") not in ("active", "activating", "reloading"),
    }


def _exit_of(module: AnsibleModule, unit: str) -> str:
    """ " (status=219/CGROUP, result exit-code)": systemd's own status of a start that failed before
    the server ran (203/EXEC, 217/USER, 219/CGROUP, ...), which its job message does not give."""
    state = systemctl_show(module, unit, ("ExecMainStatus", "ExecMainCode", "Result"))
    status, result = state.get("ExecMainStatus", ""), state.get("Result", "")
    if not status or status == "0":
        return f" (result {result})" if result and result != "success" else ""
    name = EXIT_NAMES.get(status)
    return f" (status={status}{'/' + name if name else ''}, result {result})"


#: systemd's own exit statuses of a service process that never ran its command (systemd.exec(5)).
EXIT_NAMES = {
    "200": "CHDIR",
    "203": "EXEC",
    "204": "MEMORY",
    "206": "OOM_ADJUST",
    "208": "STDIN",
    "209": "STDOUT",
    "214": "SETSCHEDULER",
    "216": "GROUP",
    "217": "USER",
    "218": "CAPABILITIES",
    "219": "CGROUP",
    "220": "SETSID",
    "226": "NAMESPACE",
    "243": "CREDENTIALS",
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    unit = module.params["unit_name"]
    systemctl = module.get_bin_path("systemctl", required=True)
    todo = plan(systemctl_show(module, unit, PROPS))
    steps = [
        (todo["reloaded"], ["daemon-reload"]),
        (todo["enabled"], ["enable", "--quiet", unit]),
        (todo["started"], ["start", unit]),
    ]
    for needed, args in steps if not module.check_mode else ():
        if not needed:
            continue
        rc, out, err = module.run_command([systemctl, *args])
        if rc != 0:
            said = " ".join((err or out).split())
            if args[0] == "start":  # what systemd recorded of the process it could not start
                said += _exit_of(module, unit)
            module.fail_json(msg=f"systemctl {' '.join(args)} failed ({rc}): {said}", **todo)
    invocation = (
        "" if module.check_mode else systemctl_show(module, unit, ("InvocationID",)).get("InvocationID", "")
    )
    module.exit_json(changed=any(todo.values()), invocation_id=invocation, **todo)


if __name__ == "__main__":
    main()
