#!/usr/bin/python
"""Ansible module: let systemd read the unit if it changed, enable it, start it.

ansible.builtin.systemd_service does the same in general form, and took 0.7-1.0 s of a 4.5 s
restart on the lab (its own module load and a reload it cannot know to skip); this is the one
transaction a restart needs, with the systemctl calls it needs and no others.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_start
short_description: Reload systemd when the unit changed, enable and start the SGLang unit
description:
  - Runs C(systemctl daemon-reload) only when systemd reports C(NeedDaemonReload=yes) for the unit
    (its file changed since systemd read it) or does not know the unit yet.
  - Enables the unit when it is not enabled, and starts it when it is not active.
  - Fails naming the unit and systemctl's message; whether the server then stays up is for the
    health wait (sglang_health_wait) to see.
author: orchestrator developers (@orchestrator)
attributes:
  check_mode:
    support: full
    description: What the module does in check mode.
    details: In check mode nothing is reloaded, enabled or started; the result says what would be.
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
options:
  unit_name: {description: The systemd unit to start., type: str, required: true}
"""

EXAMPLES = r"""
- name: Start the server
  orchestrator.sglang.sglang_start:
    unit_name: sglang.service
  register: __sglang_service
"""

RETURN = r"""
reloaded:
  description: Whether systemd re-read its units (the unit file had changed).
  type: bool
  returned: always
enabled:
  description: Whether the unit had to be enabled.
  type: bool
  returned: always
started:
  description: Whether the unit had to be started.
  type: bool
  returned: always
invocation_id:
  description: The unit's InvocationID once started (a later one means systemd restarted it); empty in
    check mode.
  type: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import module_spec
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.start import (
    ARGUMENT_SPEC,
    run,
)


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    module.exit_json(**run(module, module.params))


if __name__ == "__main__":
    main()
