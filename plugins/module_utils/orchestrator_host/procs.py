"""Processes as the host shows them: the systemd unit a process runs in, from its cgroup named as
systemd names it (cg_escape), the processes left in a unit's cgroup, and argv[0].
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection


def cgroup_unit(cgroup_text: str, units: Collection[str]) -> str:
    """Which of `units` a /proc/PID/cgroup text puts the process in (or below): a path
    component that is the unit's cgroup name (cg_escape), so sglang.service is not
    sglang.service-b. '' for none."""
    names = {cg_escape(unit): unit for unit in units}
    for line in cgroup_text.splitlines():
        for part in line.split(":", 2)[-1].split("/"):
            if part in names:
                return names[part]
    return ""


#: cgroup_controller_to_string() of systemd 252's controllers (cgroup-util.c).
CGROUP_CONTROLLERS = frozenset(
    [
        "cpu",
        "cpuacct",
        "cpuset",
        "io",
        "blkio",
        "memory",
        "devices",
        "pids",
        "bpf-firewall",
        "bpf-devices",
        "bpf-foreign",
        "bpf-socket-bind",
        "bpf-restrict-network-interfaces",
    ]
)


def cg_escape(name: str) -> str:
    """The name of a unit's cgroup, as systemd's cg_escape() makes it from the unit's: one '_' in
    front of a name that starts with '_' or '.', is a kernel file's (tasks, ...), or whose part
    before its last '.' is "cgroup" or a controller's name (`cpu.service` runs in `_cpu.service`)."""
    if (
        name[:1] in ("", "_", ".")
        or name in ("notify_on_release", "release_agent", "tasks")
        or name.startswith("cgroup.")
        or name.rpartition(".")[0] in CGROUP_CONTROLLERS
    ):
        return f"_{name}"
    return name


def proc_cgroup(pid: int | None) -> str:
    """/proc/PID/cgroup; '' when the process is gone (or `pid` is None)."""
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            return fh.read()
    except OSError:
        return ""


#: Where cgroup v2 is mounted.
CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_procs(control_group: str, root: str = CGROUP_ROOT) -> list[str]:
    """PIDs left in a unit's cgroup (systemctl show's ControlGroup) and every cgroup below it,
    cgroup v2: a unit with Delegate=yes keeps its processes in sub-cgroups (podman's
    --cgroups=split puts conmon in one and the container in another), not in its own."""
    if not control_group:
        return []
    pids = []
    for folder, _dirs, _files in os.walk(f"{root}{control_group}"):
        with contextlib.suppress(OSError), open(os.path.join(folder, "cgroup.procs")) as fh:
            pids += fh.read().split()
    return pids


def argv0(pid: int | None) -> str | None:
    """argv[0] of a process (what nvidia-smi shows as its name), None when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return None


def proc_stat(pid: int) -> tuple[str, list[str]] | None:
    """(comm, the fields after it) of /proc/PID/stat; None when the process is gone. The comm,
    in parentheses, may hold spaces and parentheses: the fields follow the last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    head, _paren, rest = text.rpartition(")")
    return head.partition("(")[2], rest.split()


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot): with the PID, it names one process.
    None when the process is gone or a zombie."""
    read = proc_stat(pid) if pid > 0 else None
    if read is None or len(read[1]) < 20 or read[1][0] in ("Z", "X"):
        return None
    return int(read[1][19])
