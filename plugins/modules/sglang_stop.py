#!/usr/bin/python
"""Ansible module: stop a unit, wait until its cgroup is empty, then until its GPUs are released.

One module instead of stop, show, wait and a GPU check: every task costs a round trip, and the
server's memory is only free once the driver has released it, some time after its processes
are gone.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_stop
short_description: Stop a systemd unit, wait until its processes are gone and its GPUs are released
description:
  - systemctl stop sends SIGTERM to the unit's processes, waits TimeoutStopSec, then
    SIGKILLs what is left of the unit's own cgroup; nothing outside the unit is touched.
  - The unit is gone when its cgroup (and every cgroup below it) is empty and no running docker
    or podman container is labelled C(orchestrator.unit) with it (a docker container runs
    under the daemon, outside the unit's cgroup; the unit's ExecStop stops it).
  - A unit that does not exist is already stopped.
  - "A unit that is not orchestrator's (systemd loads it from another file, such as
    /lib/systemd/system/ssh.service, or its file in I(paths.unit_dir) has neither orchestrator's
    header line nor stored facts) is neither stopped nor disabled: the module fails naming it."
  - Then waits until memory.used of the unit's GPUs is at most I(max_used_mib), failing with
    C(GPUs not idle after waiting N s) naming what holds them. Processes outside the unit are
    killed only with I(kill_gpu_holders), and never those of another orchestrator unit.
author: orchestrator developers (@orchestrator)
attributes:
  check_mode:
    support: full
    description: What the module does in check mode.
    details: In check mode nothing is stopped; the GPUs are reported, busy or not, without failing.
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
extends_documentation_fragment: [orchestrator.sglang.orchestrator_paths]
options:
  unit_name: {description: The systemd unit to stop., type: str, required: true}
  paths:
    description: Where orchestrator keeps things on the host. The unit's stored facts give its GPUs when
      I(gpus) is empty; the other units' facts name their processes, never killed.
  gone_timeout_s:
    description: Seconds to wait for the unit's cgroup to empty after the stop.
    type: float
    default: 30.0
  gpus:
    description: GPU indices to wait for; empty means the GPUs in the unit's stored facts, and every GPU on
      the host only for a unit stored without them.
    type: list
    elements: int
    default: []
  gpu_release_timeout_s:
    description: Seconds to wait for the GPUs' memory to be released.
    type: float
    default: 30.0
  kill_gpu_holders:
    description: Kill the processes nvidia-smi still lists on the GPUs after the stop (as gpu_idle does),
      except those of another orchestrator unit of this host.
    type: bool
    default: false
  max_used_mib: {description: A GPU counts as released at or below this many MiB used., type: int, default: 0}
  nvidia_smi: {description: The nvidia-smi executable., type: str, default: nvidia-smi}
  disable:
    description: Also disable the unit, so that a reboot does not start it again and its port counts as free
      for another unit (C(orchestrator stop)); a restart within a deploy leaves it enabled.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Stop the server and wait for its GPUs
  orchestrator.sglang.sglang_stop:
    unit_name: sglang.service
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
    gpus: [0, 1, 2, 3]
  register: __sglang_stop
"""

RETURN = r"""
was_active:
  description: Whether the unit was running before.
  type: bool
  returned: always
main_pid:
  description: MainPID before the stop (0 if none).
  type: int
  returned: always
stop_s:
  description: Seconds the stop took (0 when nothing was stopped).
  type: float
  returned: always
disabled:
  description: Whether the unit was enabled and is disabled now (with I(disable)).
  type: bool
  returned: always
gpus:
  description:
    - "The GPU wait, as gpu_idle returns it: idle, checked, gpus, holders, busy, waited_s, killed."
    - A failure because a GPU of the set is not on the host returns nvidia-smi's list of every GPU
      here instead (gpu_idle's C(gpus)).
  type: dict
  returned: success, or when the GPUs were not released
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import module_spec
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.stop import (
    ARGUMENT_SPEC,
    run,
)


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    module.exit_json(**run(module, module.params))


if __name__ == "__main__":
    main()
