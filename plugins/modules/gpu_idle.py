#!/usr/bin/python
"""Ansible module: wait until the GPUs hold no memory, or fail naming what holds it."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_idle
short_description: Check with nvidia-smi that GPUs are idle, waiting up to a release timeout
description:
  - Reads memory.used per GPU and the compute processes with nvidia-smi's CSV queries.
  - memory.used is the signal that never lies; the process list may be empty inside
    containers, so a busy GPU with no listed process is still busy. Where memory.used
    reads C([N/A]), a listed process makes the GPU busy.
  - Fails when nvidia-smi fails or reports no GPU.
  - Changes nothing unless I(kill_holders) is set.
  - Each process is reported with the orchestrator unit of this host it runs in, if any, by its
    cgroup, or else by the C(orchestrator.unit) label of the docker or podman container it runs
    in (its main PID or a descendant). Only installed engines are asked, and only when a process
    is in no unit's cgroup.
author: orchestrator developers (@orchestrator)
attributes:
  check_mode:
    support: full
    description: What the module does in check mode.
    details: In check mode nothing is killed, nothing is waited for and busy GPUs do not fail.
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
extends_documentation_fragment: [orchestrator.sglang.orchestrator_paths]
options:
  paths:
    description: Where orchestrator keeps things on the host. Its units (C(state_dir)/units/*.json) are how a
      process on a GPU is known to be another orchestrator unit's, never killed.
  gpus:
    description: GPU indices to check (our GPU set); empty means every GPU on the host.
    type: list
    elements: int
    default: []
  max_used_mib:
    description: A GPU counts as idle at or below this many MiB used (an idle H200 reads 0).
    type: int
    default: 0
  release_timeout_s:
    description: Wait this long for memory to be released before failing.
    type: float
    default: 30.0
  poll_interval_s: {description: Seconds between nvidia-smi queries while waiting., type: float, default: 0.5}
  nvidia_smi:
    description: The nvidia-smi executable (a name looked up in PATH, or a path).
    type: str
    default: nvidia-smi
  kill_holders:
    description: Kill exactly the processes nvidia-smi lists on the checked GPUs (SIGTERM, then SIGKILL after
      5 s), then wait for release, at least 10 s even with I(release_timeout_s=0). Only PIDs whose argv[0]
      matches the listed name are touched, so a PID from another namespace is never killed by mistake, and
      never a process of an orchestrator unit of this host (another server, which its own unit stops).
    type: bool
    default: false
  allow_unit:
    description: Only processes outside this systemd unit count as busy (checked before our server stops, so a
      foreign holder fails the deploy while the server still runs). memory.used cannot tell owners apart, so
      this mode judges by the process list alone; a process of another orchestrator unit counts as busy.
    type: str
    default: ""
  fail: {description: "Fail when a GPU is busy; with false, only report.", type: bool, default: true}
"""

EXAMPLES = r"""
- name: Wait up to 30 s for the GPUs of the stopped server to be released
  orchestrator.sglang.gpu_idle:
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
    gpus: [0, 1]
    release_timeout_s: 30

- name: Only report GPU memory and holders
  orchestrator.sglang.gpu_idle:
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
    release_timeout_s: 0
    fail: false
  register: __gpu_idle
"""

RETURN = r"""
idle:
  description: Whether every checked GPU is idle.
  type: bool
  returned: always
checked:
  description: The GPU indices checked (I(gpus), or every GPU when it is empty).
  type: list
  elements: int
  returned: always
gpus:
  description:
    - "Every GPU: index, uuid, name, memory_used_mib, memory_total_mib."
    - A memory figure is null where nvidia-smi printed C([N/A]) or the like.
  type: list
  elements: dict
  returned: always
holders:
  description:
    - "Processes on a checked GPU: gpu, pid, process_name, used_mib, unit."
    - C(unit) is the orchestrator unit of this host the process runs in; empty for any other process.
  type: list
  elements: dict
  returned: always
busy:
  description: "Checked GPUs that are not idle: index, memory_used_mib, holders."
  type: list
  elements: dict
  returned: always
waited_s:
  description: Seconds spent waiting for release.
  type: float
  returned: always
killed:
  description: "Processes killed with kill_holders: gpu, pid, process_name, used_mib, unit."
  type: list
  elements: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.gpus import (
    idle_message,
    wait_idle,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import (
    PATHS_SPEC,
    module_spec,
)

ARGUMENT_SPEC = {
    "paths": {
        **PATHS_SPEC,
        "description": (
            "Where orchestrator keeps things on the host. Its units (C(state_dir)/units/*.json) are "
            "how a process on a GPU is known to be another orchestrator unit's, never killed."
        ),
    },
    "gpus": {
        "type": "list",
        "elements": "int",
        "default": [],
        "description": "GPU indices to check (our GPU set); empty means every GPU on the host.",
    },
    "max_used_mib": {
        "type": "int",
        "default": 0,
        "description": "A GPU counts as idle at or below this many MiB used (an idle H200 reads 0).",
    },
    "release_timeout_s": {
        "type": "float",
        "default": 30.0,
        "description": "Wait this long for memory to be released before failing.",
    },
    "poll_interval_s": {
        "type": "float",
        "default": 0.5,
        "description": "Seconds between nvidia-smi queries while waiting.",
    },
    "nvidia_smi": {
        "type": "str",
        "default": "nvidia-smi",
        "description": "The nvidia-smi executable (a name looked up in PATH, or a path).",
    },
    "kill_holders": {
        "type": "bool",
        "default": False,
        "description": (
            "Kill exactly the processes nvidia-smi lists on the checked GPUs (SIGTERM, then SIGKILL "
            "after 5 s), then wait for release, at least 10 s even with I(release_timeout_s=0). Only "
            "PIDs whose argv[0] matches the listed name are touched, so a PID from another namespace "
            "is never killed by mistake, and never a process of an orchestrator unit of this host "
            "(another server, which its own unit stops)."
        ),
    },
    "allow_unit": {
        "type": "str",
        "default": "",
        "description": (
            "Only processes outside this systemd unit count as busy (checked before our server stops, "
            "so a foreign holder fails the deploy while the server still runs). memory.used cannot "
            "tell owners apart, so this mode judges by the process list alone; a process of another "
            "orchestrator unit counts as busy."
        ),
    },
    "fail": {
        "type": "bool",
        "default": True,
        "description": "Fail when a GPU is busy; with false, only report.",
    },
}


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    p = module.params
    release_timeout_s = 0.0 if module.check_mode else p["release_timeout_s"]
    report = wait_idle(
        module,
        paths=p["paths"],
        nvidia_smi=p["nvidia_smi"],
        gpus=p["gpus"],
        max_used_mib=p["max_used_mib"],
        release_timeout_s=release_timeout_s,
        poll_interval_s=p["poll_interval_s"],
        kill_holders=p["kill_holders"],
        allow_unit=p["allow_unit"],
        check_mode=module.check_mode,
    )
    changed = bool(report["killed"])
    if not report["idle"] and p["fail"] and not module.check_mode:
        module.fail_json(
            msg=idle_message(report, release_timeout_s, p["allow_unit"]), changed=changed, **report
        )
    module.exit_json(changed=changed, **report)


if __name__ == "__main__":
    main()
