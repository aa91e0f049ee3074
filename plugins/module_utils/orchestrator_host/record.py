"""The last known good record of a healthy deploy, and the lock released with it (sglang_record,
and the restart transaction sglang_restart).
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

from .files import ensure_attrs, ensure_dir, ensure_file, read_json
from .lock import release_if_ours
from .options import PATHS_SPEC
from .units import record_path

if TYPE_CHECKING:  # never run: the same submodules, named as Mitogen's module finder needs them
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.files
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.lock
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units  # noqa: F401

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


def run(module: Any, p: dict) -> dict:
    """sglang_record's work on the host: its result, or fail_json (which ends the module)."""
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
    return dict(changed=changed or recorded or released, recorded=recorded, released=released)
