#!/usr/bin/python
"""Ansible module: wait until the GPUs hold no memory, or fail naming what holds it."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_idle
short_description: Check with nvidia-smi that GPUs are idle, waiting up to a release timeout
description:
  - Reads memory.used per GPU and the compute processes with nvidia-smi's CSV queries.
  - memory.used is the signal that never lies; the process list may be empty inside
    containers, so a busy GPU with no listed process is still busy.
  - Never changes anything (read-only, safe in check mode).
options:
  gpus:
    description: GPU indices to check; empty means every GPU on the host.
    type: list
    elements: int
    default: []
  max_used_mib:
    description: A GPU counts as idle at or below this many MiB used.
    type: int
    default: 0
  release_timeout_s:
    description: Wait this long for memory to be released before failing.
    type: float
    default: 0
  poll_interval_s:
    description: Seconds between nvidia-smi queries while waiting.
    type: float
    default: 0.5
  nvidia_smi:
    description: The nvidia-smi executable.
    type: str
    default: nvidia-smi
  kill_holders:
    description:
      - Kill exactly the processes nvidia-smi lists on the checked GPUs (SIGTERM, then SIGKILL
        after 5 s), then wait for release. Only PIDs whose argv[0] matches the listed name
        are touched, so a PID from another namespace is never killed by mistake.
    type: bool
    default: false
  allow_unit:
    description:
      - Only processes outside this systemd unit count as busy (checked before our server
        stops, so a foreign holder fails the deploy while the server still runs). memory.used
        cannot tell owners apart, so this mode judges by the process list alone.
    type: str
    default: ""
  fail:
    description: Fail when a GPU is busy; with false, only report (for check mode).
    type: bool
    default: true
"""

RETURN = r"""
idle: {description: whether every checked GPU is idle, type: bool}
gpus: {description: "per GPU: index, uuid, name, memory_used_mib, memory_total_mib", type: list}
holders: {description: "processes on a checked GPU: gpu, pid, process_name, used_mib", type: list}
busy: {description: "checked GPUs above max_used_mib: index, memory_used_mib, holders", type: list}
waited_s: {description: seconds spent waiting for release, type: float}
killed: {description: "processes killed with kill_holders: pid, process_name, used_mib, gpu", type: list}
"""

import os
import signal
import time

from ansible.module_utils.basic import AnsibleModule

GPU_FIELDS = "index,uuid,name,memory.used,memory.total"
APP_FIELDS = "pid,process_name,used_memory,gpu_uuid"


def _csv(module: AnsibleModule, query: str, fields: str) -> list[list[str]]:
    argv = [module.params["nvidia_smi"], f"--query-{query}={fields}", "--format=csv,noheader,nounits"]
    rc, out, err = module.run_command(argv)
    if rc != 0:
        module.fail_json(msg=f"{' '.join(argv)} exited {rc}: {(out + err).strip()}", rc=rc)
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def snapshot(module: AnsibleModule) -> tuple[list[dict], list[dict]]:
    """Every GPU and every compute process, as nvidia-smi reports them now."""
    gpus = [
        {"index": int(i), "uuid": u, "name": n, "memory_used_mib": int(used), "memory_total_mib": int(total)}
        for i, u, n, used, total in _csv(module, "gpu", GPU_FIELDS)
    ]
    by_uuid = {g["uuid"]: g["index"] for g in gpus}
    apps = []
    for pid, name, used, uuid in _csv(module, "compute-apps", APP_FIELDS):
        mib = int(used) if used.isdigit() else None  # "[N/A]" when the driver cannot attribute memory
        apps.append({"gpu": by_uuid.get(uuid), "pid": int(pid), "process_name": name, "used_mib": mib})
    return gpus, apps


def in_unit(pid: int, unit: str) -> bool:
    try:
        with open(f"/proc/{pid}/cgroup") as fh:
            return f"/{unit}" in fh.read()
    except OSError:
        return False


def foreign_gpus(gpus: list[dict], apps: list[dict], wanted: list[int], unit: str) -> list[dict]:
    """Checked GPUs with a listed process outside `unit`, with those processes as holders."""
    busy = []
    for g in gpus:
        if wanted and g["index"] not in wanted:
            continue
        holders = [a for a in apps if a["gpu"] == g["index"] and not in_unit(a["pid"], unit)]
        if holders:
            busy.append({"index": g["index"], "memory_used_mib": g["memory_used_mib"], "holders": holders})
    return busy


def busy_gpus(gpus: list[dict], apps: list[dict], wanted: list[int], limit: int) -> list[dict]:
    checked = [g for g in gpus if not wanted or g["index"] in wanted]
    return [
        {
            "index": g["index"],
            "memory_used_mib": g["memory_used_mib"],
            "holders": [a for a in apps if a["gpu"] == g["index"]],
        }
        for g in checked
        if g["memory_used_mib"] > limit
    ]


def describe(busy: list[dict], foreign_only: bool = False) -> str:
    """One clause per busy GPU: index, MiB used, and each holder's PID, name and MiB."""
    parts = []
    for b in busy:
        holders = ", ".join(
            f"PID {h['pid']} {h['process_name']} {h['used_mib'] if h['used_mib'] is not None else '?'} MiB"
            for h in b["holders"]
        )
        who = holders or "no process listed (another PID namespace?)"
        if foreign_only:  # memory.used also counts our own server here: name only the others
            parts.append(f"GPU {b['index']} is used by {who}")
        else:
            parts.append(f"GPU {b['index']} has {b['memory_used_mib']} MiB used by {who}")
    return "; ".join(parts)


def _same_process(pid: int, name: str) -> bool:
    """Whether PID is the process nvidia-smi named: it shows argv[0] (seen on a real H200)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv0 = fh.read().split(b"\0", 1)[0].decode(errors="replace")
    except OSError:
        return False
    return argv0 == name


def kill(holders: list[dict]) -> list[dict]:
    """SIGTERM each holder, SIGKILL what is left after 5 s; returns the ones signalled."""
    targets = [h for h in holders if _same_process(h["pid"], h["process_name"])]
    for h in targets:
        os.kill(h["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{h['pid']}") for h in targets):
        time.sleep(0.1)
    for h in targets:
        if os.path.exists(f"/proc/{h['pid']}"):
            os.kill(h["pid"], signal.SIGKILL)
    return targets


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gpus": {"type": "list", "elements": "int", "default": []},
            "max_used_mib": {"type": "int", "default": 0},
            "release_timeout_s": {"type": "float", "default": 0},
            "poll_interval_s": {"type": "float", "default": 0.5},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "fail": {"type": "bool", "default": True},
            "kill_holders": {"type": "bool", "default": False},
            "allow_unit": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    start = time.monotonic()
    killed: list[dict] = []
    while True:
        gpus, apps = snapshot(module)
        missing = sorted(set(p["gpus"]) - {g["index"] for g in gpus})
        if missing:
            module.fail_json(msg=f"no GPU with index {missing} (the host has {len(gpus)})", gpus=gpus)
        if p["allow_unit"]:
            busy = foreign_gpus(gpus, apps, p["gpus"], p["allow_unit"])
        else:
            busy = busy_gpus(gpus, apps, p["gpus"], p["max_used_mib"])
        if busy and p["kill_holders"] and not module.check_mode and not killed:
            killed = kill([h for b in busy for h in b["holders"]])
            if killed:
                continue  # look again now that they are gone
        waited = round(time.monotonic() - start, 2)
        if not busy or waited >= p["release_timeout_s"]:
            break
        time.sleep(p["poll_interval_s"])
    wanted = set(p["gpus"]) or {g["index"] for g in gpus}
    holders = [a for a in apps if a["gpu"] in wanted]
    result = {
        "changed": bool(killed),
        "killed": killed,
        "idle": not busy,
        "gpus": gpus,
        "holders": holders,
        "busy": busy,
        "waited_s": waited,
    }
    if busy and p["fail"]:
        after = f" after waiting {waited:.1f} s" if p["release_timeout_s"] else ""
        what = f"GPUs held outside {p['allow_unit']}" if p["allow_unit"] else f"GPUs not idle{after}"
        module.fail_json(msg=f"{what}: {describe(busy, bool(p['allow_unit']))}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
