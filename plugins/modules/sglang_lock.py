#!/usr/bin/python
"""Ansible module: release the host's deploy lock taken by sglang_probe, if this run holds it."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_lock
short_description: Release this run's deploy lock on the host
description:
  - Removes the lock of I(unit_name) only when it holds I(run_id); another run's lock is left alone.
author: orchestrator developers (@orchestrator)
attributes:
  check_mode: {support: full, description: What the module does in check mode.}
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
extends_documentation_fragment: [orchestrator.sglang.orchestrator_paths]
options:
  unit_name: {description: The systemd unit the lock guards., type: str, required: true}
  paths: {description: Where orchestrator keeps things on the host (the lock lives in lock_dir).}
  run_id: {description: Only a lock holding this run id is removed., type: str, required: true}
"""

EXAMPLES = r"""
- name: Release the deploy lock
  orchestrator.sglang.sglang_lock:
    unit_name: sglang.service
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
    run_id: r1
"""

RETURN = r"""
released:
  description: Whether the lock was this run's and is now removed (in check mode, would be).
  type: bool
  returned: always
holder:
  description: The lock's content when it is held by another run.
  type: dict
  returned: when another run holds the lock
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.files import read_json
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.lock import (
    release_if_ours,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import (
    PATHS_SPEC,
    module_spec,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units import lock_path

ARGUMENT_SPEC = {
    "unit_name": {"type": "str", "required": True, "description": "The systemd unit the lock guards."},
    "paths": {
        **PATHS_SPEC,
        "description": "Where orchestrator keeps things on the host (the lock lives in lock_dir).",
    },
    "run_id": {"type": "str", "required": True, "description": "Only a lock holding this run id is removed."},
}


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    p = module.params
    holder = read_json(lock_path(p["paths"], p["unit_name"]))
    if holder and holder.get("run_id") != p["run_id"]:
        module.exit_json(changed=False, released=False, holder=holder)
    if module.check_mode:
        module.exit_json(changed=bool(holder), released=bool(holder))
    released = release_if_ours(p["paths"], p["unit_name"], p["run_id"])
    module.exit_json(changed=released, released=released)


if __name__ == "__main__":
    main()
