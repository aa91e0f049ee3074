"""`paths`, as every module that takes orchestrator_host.options.PATHS_SPEC has it.

Written by python3 scripts/role_specs.py from plugins/module_utils/orchestrator_host/options.py: change
PATHS_SPEC there, then run it."""


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  paths:
    description: Where orchestrator keeps things on the host (orchestrator/hosts/playvars.py HostPaths).
    type: dict
    required: true
    suboptions:
      unit_dir: {description: Where unit files live., type: str, required: true}
      state_dir:
        description: Root-only state directory (the units' facts, last-good records, images' cache).
        type: str
        required: true
      lock_dir: {description: Where deploy locks live (tmpfs)., type: str, required: true}
"""
