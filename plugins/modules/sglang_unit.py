#!/usr/bin/python
"""Ansible module: install an SGLang unit, its secret config and its facts, as one step.

The unit text comes rendered from the control machine (`orchestrator render` shows the same
bytes); it is installed only once `systemd-analyze verify` has accepted it, so a unit systemd
would refuse never replaces a working one.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_unit
short_description: Write the SGLang unit (checked by systemd-analyze verify), its secret config and its facts
description:
  - Makes I(paths.state_dir) a root-only (0700) directory.
  - Checks I(content) with C(systemd-analyze verify), as a temporary file with the unit's suffix
    in the unit's directory; when refused (a non-zero exit, or a line of the unit systemd says it
    ignores or cannot parse, on which verify still exits 0), fails with systemd-analyze's output
    and changes no file.
  - Writes I(secret_content) to I(secret_path) (0600, root; systemd hands it to the server as a
    credential) when a secret path is given.
  - Writes I(env_content) to I(env_path) (0600, owned by I(env_owner)), the unit's
    EnvironmentFile=, when an environment file path is given.
  - Writes I(adaptive_content) to I(adaptive_path) (0600, root; systemd hands it to the server
    as a credential), the server's --speculative-adaptive-config, when that path is given.
  - Writes I(content) to the unit file (0644) in one rename.
  - Writes C({state_dir}/units/<unit_name>.json) (0600), the I(facts) and the digest of I(content),
    which sglang_probe reads back.
  - Does not reload systemd or restart anything.
  - "Writes nothing over a unit that is not orchestrator's (systemd loads it from another file,
    such as /lib/systemd/system/ssh.service, its file in I(paths.unit_dir) has neither
    orchestrator's header line nor stored facts, or it is masked): fails naming it."
author: orchestrator developers (@orchestrator)
attributes:
  check_mode:
    support: full
    description: What the module does in check mode.
    details: Nothing is written and the unit is not verified; changed and the diff say what would change.
  diff_mode:
    support: full
    description: Whether the module returns a diff.
    details: The diff is the unit text's; the secret is never shown.
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
extends_documentation_fragment: [orchestrator.sglang.orchestrator_paths]
options:
  unit_name:
    description: The systemd unit name (its file name in I(paths.unit_dir)).
    type: str
    required: true
  content: {description: The unit text the plan rendered., type: str, required: true}
  facts:
    description: The facts of this unit (profile, port, bind, gpus, health_url, rank, nnodes).
    type: dict
    required: true
  secret_path:
    description: Host path of the secret --config file, written with I(secret_content) (0600, root); empty if
      none.
    type: str
    default: ""
  secret_content: {description: The secret config's text. Never logged., type: str, default: ""}
  env_path:
    description: Host path of the unit's EnvironmentFile= (secret variables), written with I(env_content)
      (0600, owned by I(env_owner)); empty if none.
    type: str
    default: ""
  env_content: {description: The environment file's text. Never logged., type: str, default: ""}
  env_owner: {description: Owner of I(env_path) (the service user)., type: str, default: root}
  adaptive_path:
    description: Host path of the server's C(--speculative-adaptive-config) JSON, written with
      I(adaptive_content) (0600, root; systemd hands it to the server as a credential); empty if none.
    type: str
    default: ""
  adaptive_content:
    description: The adaptive config's text (the unit's comment shows it too).
    type: str
    default: ""
  verified_digest:
    description: Digest of a unit text this run's preflight already had systemd-analyze verify accept; when it
      is I(content)'s, the check is not run twice.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Write the unit
  orchestrator.sglang.sglang_unit:
    unit_name: sglang.service
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
    content: "{{ lookup('ansible.builtin.file', 'sglang.service') }}"
    facts: {profile: llama-8b, port: 30000, bind: 0.0.0.0, gpus: [0], health_url: "http://127.0.0.1:30000/health"}
  register: __sglang_unit
"""

RETURN = r"""
digest:
  description: Digest of the unit text (sha256 prefix, as the control machine computes it).
  type: str
  returned: always
unit_path:
  description: The unit file's path.
  type: str
  returned: always
diff:
  description: The unit text before and after (before_header, after_header, before, after).
  type: dict
  returned: in diff mode
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import module_spec
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.unitfile import (
    ARGUMENT_SPEC,
    run,
)


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    module.exit_json(**run(module, module.params))


if __name__ == "__main__":
    main()
