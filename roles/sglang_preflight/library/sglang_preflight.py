#!/usr/bin/python
"""Ansible module: everything that can be known on the host before the stop, checked before it.

Read-only. Stopping a serving model to start one that cannot run costs minutes of downtime
while weights reload, so every problem found here fails the deploy while the old server
still runs. All problems are returned at once, one line each.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_preflight
short_description: Check SGLang version and flags, model, drafter, GPUs, port and disk before a restart
options:
  python: {description: The python executable of the unit., type: str, required: true}
  sglang_version: {description: SGLang version the plan was rendered for., type: str, required: true}
  flags: {description: Every flag the plan renders; each must be in --help., type: list, elements: str}
  model_path: {description: Target model directory., type: str, required: true}
  draft_model_path: {description: Draft model directory; empty if none., type: str, default: ""}
  algorithm: {description: Speculative algorithm; empty if none., type: str, default: ""}
  gpus_needed: {description: TP x DP., type: int, default: 1}
  port: {description: HTTP port of the server., type: int, required: true}
  unit_name: {description: Our unit; it may hold the port., type: str, required: true}
  skip_flags_if_digest:
    description: Skip the --help check when the installed unit has this digest (its flags already run).
    type: str
    default: ""
  log_dir: {description: Where the journal writes., type: str, default: /var/log}
  min_free_mib: {description: Free space the logs need., type: int, default: 1024}
  nvidia_smi: {description: The nvidia-smi executable., type: str, default: nvidia-smi}
  allow_gpu_holders: {description: Foreign GPU holders are no problem (killed)., type: bool, default: false}
"""

RETURN = r"""
problems: {description: one line per problem, type: list}
sglang_version: {description: the version installed on the host, type: str}
gpus: {description: GPUs nvidia-smi reports, type: int}
help_checked: {description: whether the --help flag check ran, type: bool}
"""

import hashlib
import json
import os
import re

from ansible.module_utils.basic import AnsibleModule

EAGLE1 = ("EAGLE", "NEXTN")


def installed_version(module: AnsibleModule, python: str) -> tuple[str, str]:
    code = "import importlib.metadata as m; print(m.version('sglang'))"
    rc, out, err = module.run_command([python, "-c", code])
    if rc != 0:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        return "", f"SGLang is not importable by {python}: {tail}"
    return out.strip(), ""


def help_flags(module: AnsibleModule, python: str) -> tuple[set[str], str]:
    rc, out, err = module.run_command([python, "-m", "sglang.launch_server", "--help"])
    if rc != 0:
        return (
            set(),
            f"`{python} -m sglang.launch_server --help` failed ({rc}): {(err or out).strip()[-200:]}",
        )
    return set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", out)), ""


def read_config(path: str) -> tuple[dict, str]:
    config = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        return {}, f"{path} does not exist"
    try:
        with open(config) as fh:
            return json.load(fh), ""
    except FileNotFoundError:
        return {}, f"{path} holds no config.json"
    except (OSError, ValueError) as exc:
        return {}, f"{config} is unreadable: {exc}"


def hidden_size(config: dict) -> int | None:
    """The target's hidden size: top level, or text_config for multimodal wrappers (Kimi-K2.5)."""
    return config.get("hidden_size") or (config.get("text_config") or {}).get("hidden_size")


def drafter_problems(algorithm: str, target: dict, draft: dict, draft_path: str) -> list[str]:
    archs = draft.get("architectures") or []
    eagle3 = any("Eagle3" in a for a in archs)
    problems = []
    if eagle3 and algorithm in EAGLE1:
        problems.append(
            f"drafter {draft_path} is an EAGLE-3 model ({', '.join(archs)}) but the algorithm is "
            f"{algorithm}: the server would start and silently run with accept length 1.0; "
            "use --speculative-algorithm EAGLE3"
        )
    elif algorithm == "EAGLE3" and archs and not eagle3:
        problems.append(
            f"drafter {draft_path} is not an EAGLE-3 model ({', '.join(archs)}) but the algorithm is EAGLE3; "
            "use an ...Eagle3 drafter or --speculative-algorithm EAGLE"
        )
    want, have = hidden_size(target), draft.get("target_hidden_size") or draft.get("hidden_size")
    if eagle3 and want and have and int(want) != int(have):
        problems.append(
            f"drafter {draft_path} expects target hidden size {have}, the target model has {want}"
        )
    return problems


def gpu_count(module: AnsibleModule, nvidia_smi: str) -> tuple[int, str]:
    rc, out, err = module.run_command([nvidia_smi, "--query-gpu=index", "--format=csv,noheader"])
    if rc != 0:
        return 0, f"nvidia-smi failed ({rc}): {(out + err).strip()[-200:]}"
    return len([line for line in out.splitlines() if line.strip()]), ""


def foreign_gpu_holders(module: AnsibleModule, nvidia_smi: str, unit: str) -> list[str]:
    """Processes outside our unit that hold a GPU: the deploy would stop our server and then
    find the GPUs busy, so they fail it now, while the server still runs."""
    fields = "--query-compute-apps=pid,process_name,used_memory,gpu_uuid"
    rc, out, _ = module.run_command([nvidia_smi, fields, "--format=csv,noheader,nounits"])
    rc2, gpus, _ = module.run_command([nvidia_smi, "--query-gpu=index,uuid", "--format=csv,noheader"])
    if rc or rc2:
        return []
    index = dict(reversed([c.strip() for c in line.split(",")]) for line in gpus.splitlines() if "," in line)
    holders = []
    for line in filter(str.strip, out.splitlines()):
        pid, name, mib, uuid = (c.strip() for c in line.split(","))
        try:
            with open(f"/proc/{pid}/cgroup") as fh:
                if f"/{unit}" in fh.read():
                    continue
        except OSError:
            pass
        holders.append(f"GPU {index.get(uuid, '?')} is used by PID {pid} {name} {mib} MiB")
    return holders


def listeners(port: int) -> set[str]:
    """Socket inodes listening on `port` (TCP, IPv4 and IPv6)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def socket_owners(inodes: set[str]) -> list[int]:
    owners = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners.append(int(pid))
                break
    return owners


def port_problem(port: int, unit: str) -> str:
    inodes = listeners(port)
    if not inodes:
        return ""
    foreign = []
    for pid in socket_owners(inodes):
        try:
            with open(f"/proc/{pid}/cgroup") as fh:
                if f"/{unit}" in fh.read():
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                name = fh.read().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        foreign.append(f"PID {pid} {name}")
    if foreign:
        return f"port {port} is taken by {', '.join(foreign)} (not {unit})"
    return ""


def installed_digest(unit: str) -> str:
    try:
        with open(os.path.join("/etc/systemd/system", unit), "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()[:16]
    except OSError:
        return ""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "python": {"type": "str", "required": True},
            "sglang_version": {"type": "str", "required": True},
            "flags": {"type": "list", "elements": "str", "default": []},
            "model_path": {"type": "str", "required": True},
            "draft_model_path": {"type": "str", "default": ""},
            "algorithm": {"type": "str", "default": ""},
            "gpus_needed": {"type": "int", "default": 1},
            "port": {"type": "int", "required": True},
            "unit_name": {"type": "str", "required": True},
            "skip_flags_if_digest": {"type": "str", "default": ""},
            "log_dir": {"type": "str", "default": "/var/log"},
            "min_free_mib": {"type": "int", "default": 1024},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "allow_gpu_holders": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems, version, help_checked = [], "", False
    if not os.access(p["python"], os.X_OK):
        problems.append(f"python {p['python']} does not exist or is not executable")
    else:
        version, error = installed_version(module, p["python"])
        if error:
            problems.append(error)
        elif version != p["sglang_version"]:
            problems.append(
                f"SGLang {version} is installed, the profile renders flags for {p['sglang_version']}: "
                f'set server.sglang_version: "{version}" or install {p["sglang_version"]}'
            )
        unchanged = (
            p["skip_flags_if_digest"] and installed_digest(p["unit_name"]) == p["skip_flags_if_digest"]
        )
        if not error and not unchanged:
            known, error = help_flags(module, p["python"])
            help_checked = True
            if error:
                problems.append(error)
            for flag in p["flags"]:
                if known and flag not in known:
                    problems.append(
                        f"flag {flag} is not in this host's `sglang.launch_server --help` (SGLang {version})"
                    )
    target, error = read_config(p["model_path"])
    if error:
        problems.append(f"model path: {error}")
    if p["draft_model_path"]:
        draft, error = read_config(p["draft_model_path"])
        if error:
            problems.append(f"draft model path: {error}")
        elif p["algorithm"]:
            problems += drafter_problems(p["algorithm"], target, draft, p["draft_model_path"])
    gpus, error = gpu_count(module, p["nvidia_smi"])
    if error:
        problems.append(error)
    elif p["gpus_needed"] > gpus:
        problems.append(f"TP x DP = {p['gpus_needed']} GPUs needed, nvidia-smi reports {gpus} on this host")
    if not error and not p["allow_gpu_holders"]:
        for holder in foreign_gpu_holders(module, p["nvidia_smi"], p["unit_name"]):
            problems.append(f"{holder}, outside {p['unit_name']} (--kill-gpu-holders kills it)")
    problem = port_problem(p["port"], p["unit_name"])
    if problem:
        problems.append(problem)
    stat = os.statvfs(p["log_dir"])
    free_mib = stat.f_bavail * stat.f_frsize // 2**20
    if free_mib < p["min_free_mib"]:
        problems.append(f"{p['log_dir']} has {free_mib} MiB free, the logs need {p['min_free_mib']} MiB")
    result = {
        "changed": False,
        "problems": problems,
        "sglang_version": version,
        "gpus": gpus,
        "help_checked": help_checked,
    }
    if problems:
        module.fail_json(msg="preflight: " + "; ".join(problems), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
