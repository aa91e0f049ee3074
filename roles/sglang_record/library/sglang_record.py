#!/usr/bin/python
"""Ansible module: record a healthy deploy as the host's last known good, and end its lock.

The record ({profile, digest, unit, time, facts}) is what `rollback` puts back: the unit text
with the facts stored beside it, so nothing is parsed back out of the unit.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_record
short_description: Record the last known good SGLang unit with its facts; release the run's lock
description:
  - Writes C({state_dir}/last-good/<unit_name>.json) (directory 0700, file 0600) as
    C({profile, digest, unit, time, facts}), time in UTC ISO 8601.
  - Leaves the record alone when it already holds the same digest and facts (its time stays).
  - Then releases the host's deploy lock when I(release_run_id) holds it.
attributes:
  check_mode: {support: full}
  diff_mode: {support: none}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
extends_documentation_fragment: [orchestrator_paths]
options:
  unit_name: {description: The systemd unit whose healthy deploy is recorded., type: str, required: true}
  profile: {description: The profile the unit was rendered from., type: str, required: true}
  digest: {description: Digest of the unit text., type: str, required: true}
  unit: {description: The unit text., type: str, required: true}
  facts: {description: The facts of the unit (as sglang_unit stored them)., type: dict, required: true}
  release_run_id:
    description: Release the deploy lock if this run id holds it; empty releases nothing.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Record the healthy deploy
  sglang_record:
    unit_name: sglang.service
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
    profile: llama-8b
    digest: 0123456789abcdef
    unit: "{{ unit_text }}"
    facts: {profile: llama-8b, port: 30000, bind: 0.0.0.0, gpus: [0], health_url: "http://127.0.0.1:30000/health"}
    release_run_id: r1
"""

RETURN = r"""
recorded:
  description: Whether the record was written now (false when it already held this digest and these facts).
  type: bool
  returned: always
released:
  description: Whether the deploy lock of I(release_run_id) was released.
  type: bool
  returned: always
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.orchestrator_host.files import ensure_attrs, ensure_dir, ensure_file, read_json
from ansible.module_utils.orchestrator_host.lock import release_if_ours
from ansible.module_utils.orchestrator_host.options import PATHS_SPEC
from ansible.module_utils.orchestrator_host.units import record_path

ARGUMENT_SPEC = {
    "unit_name": {
        "type": "str",
        "required": True,
        "description": "The systemd unit whose healthy deploy is recorded.",
    },
    "paths": PATHS_SPEC,
    "profile": {"type": "str", "required": True, "description": "The profile the unit was rendered from."},
    "digest": {"type": "str", "required": True, "description": "Digest of the unit text."},
    "unit": {"type": "str", "required": True, "description": "The unit text."},
    "facts": {
        "type": "dict",
        "required": True,
        "description": "The facts of the unit (as sglang_unit stored them).",
    },
    "release_run_id": {
        "type": "str",
        "default": "",
        "description": "Release the deploy lock if this run id holds it; empty releases nothing.",
    },
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    path = record_path(p["paths"], p["unit_name"])
    current = read_json(path)
    recorded = (current.get("digest"), current.get("facts")) != (p["digest"], p["facts"])
    changed = ensure_dir(module, p["paths"]["state_dir"])
    changed = ensure_dir(module, os.path.dirname(path)) or changed
    if recorded:
        record = {
            "profile": p["profile"],
            "digest": p["digest"],
            "unit": p["unit"],
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "facts": p["facts"],
        }
        ensure_file(module, path, (json.dumps(record, indent=4, sort_keys=True) + "\n").encode(), 0o600)
    else:
        changed = ensure_attrs(module, path, 0o600) or changed
    released = False
    if p["release_run_id"] and not module.check_mode:
        released = release_if_ours(p["paths"], p["unit_name"], p["release_run_id"])
    module.exit_json(changed=changed or recorded or released, recorded=recorded, released=released)


if __name__ == "__main__":
    main()
