#!/usr/bin/python
"""Ansible module: release the host's deploy lock taken by sglang_unit_facts, if it is ours."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_lock
short_description: Release this run's deploy lock on the host
options:
  unit_name: {description: The systemd unit the lock guards., type: str, required: true}
  run_id: {description: Only a lock holding this run id is removed., type: str, required: true}
"""

import contextlib
import json
import os

from ansible.module_utils.basic import AnsibleModule

LOCK_DIR = "/run/orchestrator"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit_name": {"type": "str", "required": True},
            "run_id": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    path = os.path.join(LOCK_DIR, f"{module.params['unit_name']}.lock")
    try:
        with open(path) as fh:
            holder = json.load(fh)
    except (OSError, ValueError):
        module.exit_json(changed=False, released=False)
    if holder.get("run_id") != module.params["run_id"]:
        module.exit_json(changed=False, released=False, holder=holder)
    if not module.check_mode:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    module.exit_json(changed=False, released=True)


if __name__ == "__main__":
    main()
