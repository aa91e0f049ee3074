"""Where things live: the project's own files, and the state directory outside the repo."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

#: The package's own folder.
PACKAGE_DIR = Path(__file__).resolve().parent
#: The source checkout this runs from (a clone, or an editable install of one), or None for an
#: installed wheel. A checkout keeps playbooks/, roles/, templates/ and profiles/ at its top level;
#: the wheel carries them inside the package (pyproject.toml maps them in at build time).
CHECKOUT: Path | None = None if (PACKAGE_DIR / "playbooks").is_dir() else PACKAGE_DIR.parent
#: The folder holding playbooks/, roles/, templates/ and profiles/: the checkout, else the package.
ROOT = CHECKOUT or PACKAGE_DIR
#: The example profiles shipped with the tool (`example:NAME`): the checkout's profiles/.
EXAMPLES_DIR = ROOT / "profiles"
TEMPLATES_DIR = ROOT / "templates"
PLAYBOOKS_DIR = ROOT / "playbooks"
ROLES_DIR = ROOT / "roles"
#: Host-side code shared by the roles' modules (ANSIBLE_MODULE_UTILS).
MODULE_UTILS_DIR = PLAYBOOKS_DIR / "module_utils"


#: The name playbooks/module_utils has on the control machine (`ansible.module_utils` on a host).
_MODULE_UTILS_PACKAGE = "orchestrator_module_utils"


def module_utils(name: str) -> ModuleType:
    """playbooks/module_utils/NAME.py, or a submodule of a package there (orchestrator_host.systemd),
    loaded on the control machine as it is shipped to hosts (its pure functions: the gateway
    client, the host's parsers), once per process. Only that file and what it imports are loaded:
    a package's submodules import each other relatively, so they need no `ansible.module_utils`."""
    if _MODULE_UTILS_PACKAGE not in sys.modules:
        spec = importlib.machinery.ModuleSpec(_MODULE_UTILS_PACKAGE, None, is_package=True)
        spec.submodule_search_locations = [str(MODULE_UTILS_DIR)]
        sys.modules[_MODULE_UTILS_PACKAGE] = importlib.util.module_from_spec(spec)
    return importlib.import_module(f"{_MODULE_UTILS_PACKAGE}.{name}")


def state_dir() -> Path:
    """`$ORCHESTRATOR_STATE_DIR`, else `$XDG_STATE_HOME/orchestrator`, else ~/.local/state/orchestrator."""
    explicit = os.environ.get("ORCHESTRATOR_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "orchestrator"
