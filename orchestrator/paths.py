"""Where things live: the project's own files, and the state directory outside the repo."""

from __future__ import annotations

import os
from pathlib import Path

#: The project root (playbooks/, roles/, templates/, profiles/ sit beside the package).
ROOT = Path(__file__).resolve().parent.parent
PROFILES_DIR = ROOT / "profiles"
TEMPLATES_DIR = ROOT / "templates"
PLAYBOOKS_DIR = ROOT / "playbooks"
ROLES_DIR = ROOT / "roles"
#: Host-side code shared by the roles' modules (ANSIBLE_MODULE_UTILS).
MODULE_UTILS_DIR = PLAYBOOKS_DIR / "module_utils"


def state_dir() -> Path:
    """`$ORCHESTRATOR_STATE_DIR`, else `$XDG_STATE_HOME/orchestrator`, else ~/.local/state/orchestrator."""
    explicit = os.environ.get("ORCHESTRATOR_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "orchestrator"
