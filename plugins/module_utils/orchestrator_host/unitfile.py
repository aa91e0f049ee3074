"""Writing a unit: its secret files, the unit once systemd-analyze verify accepted it, and its
facts (sglang_unit, and the restart transaction sglang_restart).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import TYPE_CHECKING, Any

from .files import ensure_dir, ensure_file, read_bytes
from .options import PATHS_SPEC
from .systemd import systemctl_show, verify_unit
from .units import (
    OWNER_PROPS,
    facts_path,
    foreign_write,
    unit_digest,
    unit_path,
)

if TYPE_CHECKING:  # never run: the same submodules, named as Mitogen's module finder needs them
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.files
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.options
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.systemd
    import ansible_collections.orchestrator.sglang.plugins.module_utils.orchestrator_host.units  # noqa: F401

ARGUMENT_SPEC = {
    "unit_name": {
        "type": "str",
        "required": True,
        "description": "The systemd unit name (its file name in I(paths.unit_dir)).",
    },
    "paths": PATHS_SPEC,
    "content": {"type": "str", "required": True, "description": "The unit text the plan rendered."},
    "facts": {
        "type": "dict",
        "required": True,
        "description": "The facts of this unit (profile, port, bind, gpus, health_url, rank, nnodes).",
    },
    "secret_path": {
        "type": "str",
        "default": "",
        "no_log": False,
        "description": (
            "Host path of the secret --config file, written with I(secret_content) (0600, root); "
            "empty if none."
        ),
    },
    "secret_content": {
        "type": "str",
        "default": "",
        "no_log": True,
        "description": "The secret config's text. Never logged.",
    },
    "env_path": {
        "type": "str",
        "default": "",
        "no_log": False,
        "description": (
            "Host path of the unit's EnvironmentFile= (secret variables), written with I(env_content) "
            "(0600, owned by I(env_owner)); empty if none."
        ),
    },
    "env_content": {
        "type": "str",
        "default": "",
        "no_log": True,
        "description": "The environment file's text. Never logged.",
    },
    "env_owner": {
        "type": "str",
        "default": "root",
        "description": "Owner of I(env_path) (the service user).",
    },
    "adaptive_path": {
        "type": "str",
        "default": "",
        "description": (
            "Host path of the server's C(--speculative-adaptive-config) JSON, written with "
            "I(adaptive_content) (0600, root; systemd hands it to the server as a credential); empty if none."
        ),
    },
    "adaptive_content": {
        "type": "str",
        "default": "",
        "description": "The adaptive config's text (the unit's comment shows it too).",
    },
    "verified_digest": {
        "type": "str",
        "default": "",
        "description": (
            "Digest of a unit text this run's preflight already had systemd-analyze verify accept; "
            "when it is I(content)'s, the check is not run twice."
        ),
    },
}


def verified_copy(module: Any, p: dict, data: bytes) -> str:
    """A 0644 temporary file holding `data` beside the unit, accepted by systemd-analyze verify
    (unless this run's preflight already verified these bytes: I(verified_digest)). Its name
    starts with a dot and no unit refers to it, so systemd starts nothing from it (systemd 252 does
    load a hidden unit file when asked for it by name: `systemd --test --unit=.x.service`)."""
    unit_dir, name = p["paths"]["unit_dir"], p["unit_name"]
    if p["verified_digest"] and p["verified_digest"] == unit_digest(data):
        stem, suffix = os.path.splitext(name)
        fd, tmp = tempfile.mkstemp(prefix=f".{stem}-", suffix=suffix, dir=unit_dir)
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(data)
        return tmp
    tmp, complaint = verify_unit(module, name, data, unit_dir)
    if complaint:
        module.fail_json(msg=f"systemd-analyze verify refused {name}: {complaint}")
    return tmp


def write_all(module: Any, p: dict, digest: str, before: bytes | None) -> bool:
    """Directories, secret and adaptive config, unit, facts, in that order; the unit checked before
    any file changes."""
    paths, name, content = p["paths"], p["unit_name"], p["content"].encode()
    changed = ensure_dir(module, paths["state_dir"])
    changed = ensure_dir(module, os.path.dirname(facts_path(paths, name))) or changed
    new_unit = before != content
    tmp = verified_copy(module, p, content) if new_unit and not module.check_mode else ""
    try:
        for path, text, owner in (
            (p["secret_path"], p["secret_content"], "root"),
            (p["env_path"], p["env_content"], p["env_owner"]),
            (p["adaptive_path"], p["adaptive_content"], "root"),
        ):
            if not path:
                continue
            if not module.check_mode:  # its directory is made if missing, never changed
                os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            changed = ensure_file(module, path, text.encode(), 0o600, owner) or changed
        if tmp:
            os.replace(tmp, unit_path(paths, name))
        elif not new_unit:
            changed = ensure_file(module, unit_path(paths, name), content, 0o644) or changed  # mode, owner
    finally:
        with contextlib.suppress(FileNotFoundError):
            if tmp:
                os.unlink(tmp)
    facts = json.dumps({**p["facts"], "digest": digest}, indent=2, sort_keys=True) + "\n"
    changed = ensure_file(module, facts_path(paths, name), facts.encode(), 0o600) or changed
    return changed or new_unit


def run(module: Any, p: dict) -> dict:
    """sglang_unit's work on the host: its result, or fail_json (which ends the module)."""
    foreign = foreign_write(systemctl_show(module, p["unit_name"], OWNER_PROPS), p["paths"], p["unit_name"])
    if foreign:
        module.fail_json(msg=f"{foreign}: not writing over it; give this profile another service.unit_name")
    path = unit_path(p["paths"], p["unit_name"])
    digest = unit_digest(p["content"].encode())
    before = read_bytes(path)
    result = {"changed": write_all(module, p, digest, before), "digest": digest, "unit_path": path}
    if module._diff:
        result["diff"] = {
            "before_header": path,
            "after_header": path,
            "before": before.decode(errors="replace") if before is not None else "",
            "after": p["content"],
        }
    return result
