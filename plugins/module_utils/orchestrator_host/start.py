"""Starting a unit: a daemon-reload where it changed, enable, start, and systemd's own status of
a start that failed (sglang_start, and the restart transaction sglang_restart).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .systemd import systemctl_show

if TYPE_CHECKING:  # never run: the same submodules, named as Mitogen's module finder needs them
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.systemd  # noqa: F401

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


def _exit_of(module: Any, unit: str) -> str:
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


def run(module: Any, p: dict) -> dict:
    """sglang_start's work on the host: its result, or fail_json (which ends the module)."""
    unit = p["unit_name"]
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
    return dict(changed=any(todo.values()), invocation_id=invocation, **todo)
