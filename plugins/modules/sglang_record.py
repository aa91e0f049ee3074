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
author: orchestrator developers (@orchestrator)
attributes:
  check_mode: {support: full, description: What the module does in check mode.}
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
extends_documentation_fragment: [orchestrator.sglang.orchestrator_paths]
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
  orchestrator.sglang.sglang_record:
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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import module_spec
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.record import (
    ARGUMENT_SPEC,
    run,
)


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    module.exit_json(**run(module, module.params))


if __name__ == "__main__":
    main()
