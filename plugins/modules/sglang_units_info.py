#!/usr/bin/python
"""Ansible module: the SGLang units orchestrator deployed on this host, and the SGLang servers no
unit of it runs (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_units_info
short_description: List the units orchestrator deployed on this host
description:
  - A unit is orchestrator's when C(state_dir)/units/<unit>.json holds its facts (sglang_unit
    writes them with the unit) and its unit file is still installed.
  - Also lists the SGLang servers of the host that no orchestrator unit runs (started by hand,
    another's unit, a container), from one walk of /proc, as M(orchestrator.sglang.sglang_adopt)
    finds them. An engine is asked only about a server in a container (its C(orchestrator.unit)
    label).
  - Changes nothing.
author: orchestrator developers (@orchestrator)
attributes:
  check_mode: {support: full, description: What the module does in check mode.}
  diff_mode: {support: none, description: Whether the module returns a diff.}
# Written by python3 scripts/role_specs.py from ARGUMENT_SPEC below:
extends_documentation_fragment: [orchestrator.sglang.orchestrator_paths]
options:
  unit_name:
    description: Only this unit, listed whether it is installed or not (C(status --unit)); empty lists every
      orchestrator unit of the host.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: List the orchestrator units
  orchestrator.sglang.sglang_units_info:
    paths: {unit_dir: /etc/systemd/system, state_dir: /etc/orchestrator, lock_dir: /run/orchestrator}
  register: __sglang_units
"""

RETURN = r"""
units:
  description: The unit names, sorted; [] when the host has none.
  type: list
  elements: str
  returned: always
foreign:
  description:
    - "The SGLang servers no orchestrator unit runs, by PID: {pid, user, started (epoch s), ports,
      launcher {kind, detail}, argv, log}; [] when none."
    - "argv has each secret flag's value as C(<secret>); log is the file its stdout writes, empty when
      none; launcher kind: nohup, tmux, screen, unit, container, shell or init."
  type: list
  elements: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.adopt import foreign
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options import (
    PATHS_SPEC,
    module_spec,
)
from ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units import (
    installed_units,
)

ARGUMENT_SPEC = {
    "paths": PATHS_SPEC,
    "unit_name": {
        "type": "str",
        "default": "",
        "description": (
            "Only this unit, listed whether it is installed or not (C(status --unit)); empty lists "
            "every orchestrator unit of the host."
        ),
    },
}


def main() -> None:
    module = AnsibleModule(argument_spec=module_spec(ARGUMENT_SPEC), supports_check_mode=True)
    p = module.params
    units = [p["unit_name"]] if p["unit_name"] else list(installed_units(p["paths"]))
    module.exit_json(changed=False, units=units, foreign=foreign(module, p["paths"]))


if __name__ == "__main__":
    main()
